package native

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// reapers bounds how many killed sandboxes release their host resources at
// once; reapTimeout bounds one release. maxPendingReleases bounds how many
// killed sandboxes may wait for their release (a Kill past it waits; a
// Create waits while half of it is pending, at most backlogWait).
const (
	reapers            = 2
	reapTimeout        = time.Minute
	maxPendingReleases = 64
	backlogWait        = 30 * time.Second
)

// teardown stops and releases a sandbox at once. It tolerates a partially
// created sandbox (a failed Create ends with it).
func (s *sandbox) teardown(ctx context.Context) error {
	return errors.Join(s.stop(), s.release(ctx))
}

// stop ends every process of the sandbox: SIGKILL to its PID 1 makes the
// kernel kill every process of its pid namespace, and the init is reaped
// only once they are all gone.
func (s *sandbox) stop() error {
	if s.proc != nil {
		_ = s.proc.Kill()
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			return errors.New("sandbox init did not exit")
		}
	}
	return nil
}

// release frees the host resources of a stopped sandbox, in reverse order
// of creation. What the cgroup still holds, if anything, is killed first.
func (s *sandbox) release(ctx context.Context) error {
	var errs []error
	if s.lifeline != nil {
		s.lifeline.Close()
	}
	if s.net != nil {
		// The TUN device died with the sandbox's netns; what is left is
		// the stack's memory and goroutines, whose shutdown (tens of ms)
		// need not delay anything. Close waits for it.
		st := s.net
		s.net = nil
		s.b.closing.Go(func() {
			if err := st.Close(); err != nil {
				s.b.log.Warn("closing sandbox network", "sandbox_id", s.id, "err", err)
			}
		})
	}
	s.closeUsage()
	if s.cg != nil && !s.cgRemoved {
		if err := s.cg.Remove(ctx); err != nil {
			errs = append(errs, fmt.Errorf("removing cgroup: %w", err))
		}
	}
	if s.detached != nil {
		<-s.detached
	}
	s.stopWatch()
	s.layerMu.Lock()
	s.layerGone = true
	if s.diskFD >= 0 {
		unix.Close(s.diskFD)
		s.diskFD = -1
	}
	s.layerMu.Unlock()
	if err := s.b.removeLeftovers(ctx, s.key); err != nil {
		errs = append(errs, err)
	}
	s.slot.release()
	s.b.mu.Lock()
	s.b.dropLive(s)
	s.b.mu.Unlock()
	return errors.Join(errs...)
}

// removeCgroup removes the cgroup of a killed sandbox ahead of the rest
// of its release; a failure is left to release, which tries again.
func (s *sandbox) removeCgroup(ctx context.Context) {
	if s.cg == nil {
		return
	}
	s.closeUsage()
	if err := s.cg.Remove(ctx); err == nil {
		s.cgRemoved = true
	}
}
