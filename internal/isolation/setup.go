package isolation

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
)

// Setup holds the options every backend's New resolves the same way.
type Setup struct {
	// StateDir is the backend's state directory; required.
	StateDir string
	// Instance names the backend's resources on the host; empty means
	// the instanceOf given to Resolve, of the absolute StateDir.
	Instance string
	// Logger receives the backend's logs; nil discards them.
	Logger *slog.Logger
	// Executable is the fence binary; empty means the running one.
	Executable string
}

// Resolve returns s with its defaults filled in and StateDir made
// absolute, or an error (naming backend) if StateDir is empty.
func (s Setup) Resolve(backend string, instanceOf func(stateDir string) string) (Setup, error) {
	if s.StateDir == "" {
		return Setup{}, fmt.Errorf("%s backend: StateDir is required", backend)
	}
	abs, err := filepath.Abs(s.StateDir)
	if err != nil {
		return Setup{}, fmt.Errorf("resolving state directory: %w", err)
	}
	s.StateDir = abs
	if s.Instance == "" {
		s.Instance = instanceOf(abs)
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if s.Executable == "" {
		if s.Executable, err = os.Executable(); err != nil {
			return Setup{}, fmt.Errorf("finding own executable: %w", err)
		}
	}
	return s, nil
}
