package isolation

import (
	"errors"
	"testing"
)

// Gone is nil for a live sandbox and wraps ErrNotFound for a stopped or
// killed one.
func TestGone(t *testing.T) {
	done := make(chan struct{})
	if err := Gone("a", done, false); err != nil {
		t.Errorf("live: %v", err)
	}
	if err := Gone("a", done, true); !errors.Is(err, ErrNotFound) {
		t.Errorf("killed: %v", err)
	}
	close(done)
	if err := Gone("a", done, false); !errors.Is(err, ErrNotFound) {
		t.Errorf("stopped: %v", err)
	}
}

// PauseChange has a Pause act only on a running sandbox and a Resume only
// on a paused one, and neither on a sandbox gone.
func TestPauseChange(t *testing.T) {
	live, stopped := make(chan struct{}), make(chan struct{})
	close(stopped)
	for _, c := range []struct {
		name                  string
		done                  chan struct{}
		killed, paused, pause bool
		want                  bool
		gone                  bool
	}{
		{name: "pause running", done: live, pause: true, want: true},
		{name: "pause paused", done: live, paused: true, pause: true},
		{name: "resume paused", done: live, paused: true, want: true},
		{name: "resume running", done: live},
		{name: "pause killed", done: live, killed: true, pause: true, gone: true},
		{name: "resume stopped", done: stopped, paused: true, gone: true},
	} {
		got, err := PauseChange("a", c.done, c.killed, c.paused, c.pause)
		if got != c.want || errors.Is(err, ErrNotFound) != c.gone || (err != nil) != c.gone {
			t.Errorf("%s: PauseChange() = %v, %v; want %v, gone %v", c.name, got, err, c.want, c.gone)
		}
	}
}
