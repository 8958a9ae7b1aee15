package isolation

import "fmt"

// Gone returns an error wrapping ErrNotFound for a sandbox whose run has
// ended (done is closed) or that was killed, and nil for a live one.
func Gone(id string, done <-chan struct{}, killed bool) error {
	select {
	case <-done:
		return fmt.Errorf("sandbox %s has stopped: %w", id, ErrNotFound)
	default:
	}
	if killed {
		return fmt.Errorf("sandbox %s is killed: %w", id, ErrNotFound)
	}
	return nil
}
