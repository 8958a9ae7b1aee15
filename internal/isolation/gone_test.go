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
