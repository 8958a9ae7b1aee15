package sandbox

import (
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/sandbox/usage"
)

// TestUsageClockIsMonotonic: the times a sandbox's usage is measured
// between keep the clock's monotonic reading through create, pause,
// resume and a reading, so a step of the wall clock during its life is
// not charged as running or paused time.
func TestUsageClockIsMonotonic(t *testing.T) {
	e := newEnv(t)
	s := e.mustCreate(t, CreateRequest{})
	acc := func(what string) {
		t.Helper()
		e.m.mu.Lock()
		en := e.m.running[s.ID]
		e.m.mu.Unlock()
		en.mu.Lock()
		times := en.use.Times()
		en.mu.Unlock()
		for _, at := range times {
			// A time with a monotonic reading prints it as "m=±s".
			if !strings.Contains(at.String(), " m=") {
				t.Errorf("after %s: usage time %v has no monotonic reading", what, at)
			}
		}
	}
	acc("create")
	if err := e.m.Pauses().Pause(t.Context(), s.ID, WithMemory); err != nil {
		t.Fatal(err)
	}
	acc("pause")
	if _, err := e.m.Pauses().Resume(t.Context(), s.ID, time.Minute, nil, WithMemory); err != nil {
		t.Fatal(err)
	}
	acc("resume")
	if _, err := e.m.Meter().Usage(t.Context(), usage.Filter{Sandbox: s.ID}); err != nil {
		t.Fatal(err)
	}
	acc("a reading")
}
