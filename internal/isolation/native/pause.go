package native

import (
	"context"
	"fmt"

	"github.com/fencesandbox/fence/internal/isolation"
)

// Pause implements isolation.Pauser: it freezes the sandbox's cgroup
// (cgroup.freeze on v2, the freezer hierarchy on v1) and returns once every
// task is frozen. Memory stays where it is, charged to the sandbox.
func (s *sandbox) Pause(ctx context.Context) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if change, err := isolation.PauseChange(s.id, s.done, s.killed, s.paused.Load(), true); !change {
		return err
	}
	// A command started just before the pause gets past its start first
	// (see cgroup.Group.SettleStarts), so that what it then waits for (a sleep,
	// a timer) counts on through the freeze instead of starting at the
	// resume.
	if waited, quiet := s.cg.SettleStarts(ctx, s.done); !quiet {
		s.b.log.Debug("pausing a busy sandbox", "sandbox_id", s.id, "waited", waited)
	}
	// Refuse new connections before anything stops answering them.
	s.paused.Store(true)
	if err := s.cg.Freeze(); err != nil {
		if terr := s.cg.Thaw(); terr != nil {
			// Neither frozen nor thawed: the sandbox is of no use.
			return fmt.Errorf("pausing sandbox %s: %w (and thawing: %v)", s.id, err, terr)
		}
		s.paused.Store(false)
		return fmt.Errorf("pausing sandbox %s: %w", s.id, err)
	}
	return nil
}

// Resume implements isolation.Pauser: it thaws the sandbox's cgroup.
func (s *sandbox) Resume(ctx context.Context) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if change, err := isolation.PauseChange(s.id, s.done, s.killed, s.paused.Load(), false); !change {
		return err
	}
	if err := s.cg.Thaw(); err != nil {
		return fmt.Errorf("resuming sandbox %s: %w", s.id, err)
	}
	s.paused.Store(false)
	return nil
}

// liveLocked reports an error wrapping isolation.ErrNotFound for a killed
// or stopped sandbox.
//
// +checklocks:s.pmu
func (s *sandbox) liveLocked() error { return isolation.Gone(s.id, s.done, s.killed) }
