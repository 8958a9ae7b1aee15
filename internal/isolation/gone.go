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

// PauseChange is the guard that opens a backend sandbox's Pause (pause
// true) and Resume (pause false), under the lock that serialises them
// with its Kill: an error wrapping ErrNotFound for a sandbox gone (Gone),
// false for one paused already (or running already, for Resume), which
// leaves nothing to do, and true when the change is to be made.
func PauseChange(id string, done <-chan struct{}, killed, paused, pause bool) (bool, error) {
	if err := Gone(id, done, killed); err != nil {
		return false, err
	}
	return paused != pause, nil
}
