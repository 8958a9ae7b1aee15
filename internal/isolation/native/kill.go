package native

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// killRounds bounds how many times signalAll reads the sandbox's cgroup
// for processes forked while it was signalling the others.
const killRounds = 64

// signalAll sends SIGKILL to every process of the sandbox and returns once
// every one of them has it pending: none can return to user space again,
// whatever the kernel still has to do to end them (their exits, the
// teardown of the sandbox's mount and network namespaces). Kill returns
// then; waiting for the exits is the background release's.
//
// The processes are found in the sandbox's cgroup. A process forked while
// they are signalled shows up in the next read (its parent had not yet got
// the signal, or the fork would have failed), so the reads go on until one
// finds nothing new. A pid is signalled through a pidfd opened before the
// pid is seen in the cgroup once more: a pid freed and taken by a host
// process in between is never signalled.
func (s *sandbox) signalAll() error {
	if s.proc == nil {
		return nil
	}
	if s.cg == nil {
		return errors.New("no cgroup to find the sandbox's processes in")
	}
	// PID 1 first: its death makes the kernel kill the rest of its pid
	// namespace anyway.
	if err := s.proc.Signal(unix.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling sandbox init: %w", err)
	}
	done := map[int]bool{}
	for range killRounds {
		pids, err := s.cg.Pids()
		if err != nil {
			return err
		}
		fds := map[int]int{}
		for _, p := range pids {
			if done[p] {
				continue
			}
			fd, err := unix.PidfdOpen(p, 0)
			if err != nil {
				done[p] = true // gone already
				continue
			}
			fds[p] = fd
		}
		if len(fds) == 0 {
			return nil
		}
		again, err := s.cg.Pids()
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			return err
		}
		var serr error
		for p, fd := range fds {
			if _, ok := slices.BinarySearch(again, p); ok {
				if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
					serr = fmt.Errorf("signalling %d: %w", p, err)
				}
			}
			unix.Close(fd)
			done[p] = true
		}
		if serr != nil {
			return serr
		}
	}
	return fmt.Errorf("processes kept appearing after %d rounds of SIGKILL", killRounds)
}

// awaitExit waits (in the background release) until the sandbox's init
// has been reaped, i.e. every process of its pid namespace is gone; past
// the deadline the release goes on, and removing the cgroup kills and
// waits for what is left.
func (s *sandbox) awaitExit(d time.Duration) {
	if s.proc == nil {
		return
	}
	select {
	case <-s.done:
	case <-time.After(d):
		s.b.log.Warn("a killed sandbox's init did not exit in time", "sandbox_id", s.id)
	}
}

// Kill implements isolation.Sandbox. It returns once no process of the
// sandbox can run again: every one has SIGKILL pending (signalAll). Their
// exits (with the kernel's teardown of the sandbox's namespaces) and the
// release of its host resources (cgroup, writable layer, state directory,
// uid slot) happen after, in the background, at most reapers at a time and
// at most maxPendingReleases pending (Backend.Close waits for them). A
// crash meanwhile leaves them to the next start's Cleanup, as for any
// other leftover.
func (s *sandbox) Kill(ctx context.Context) error {
	s.killOnce.Do(func() {
		if s.killing != nil {
			close(s.killing)
		}
		s.pmu.Lock()
		s.killed = true
		frozen := s.paused.Load()
		s.pmu.Unlock()
		if frozen {
			s.killErr = s.killFrozen()
		}
		if s.killErr == nil {
			s.killErr = s.signalAll()
			if s.killErr != nil {
				// Not every process could be found: wait for the kernel to
				// end them all, as the death of PID 1 makes it do.
				s.b.log.Warn("signalling a sandbox's processes; waiting for them", "sandbox_id", s.id, "err", s.killErr)
				s.killErr = s.stop()
			}
		}
		if s.killErr == nil {
			s.gone.Store(true)
		}
		if s.killErr != nil {
			// Something of the sandbox may still run: release what can be
			// released now and tell the caller.
			s.killErr = errors.Join(s.killErr, s.release(context.WithoutCancel(ctx)))
			return
		}
		// The pending release is counted before Kill returns: past the
		// budget, Kill waits here for the teardown to catch up.
		s.b.pending.add()
		s.b.closing.Go(func() {
			defer s.b.pending.done()
			if h := s.b.reapHook; h != nil {
				h(s.id)
			}
			// The exits take no reaper: the kernel does that work.
			t0 := time.Now()
			s.awaitExit(10 * time.Second)
			s.b.reapers <- struct{}{}
			defer func() { <-s.b.reapers }()
			t1 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), reapTimeout)
			defer cancel()
			// The cgroup goes first: the sandbox no longer exists for the
			// host's accounting while its layer is archived.
			s.removeCgroup(ctx)
			t2 := time.Now()
			if !s.standby.Load() {
				s.archiveLayer()
			}
			t3 := time.Now()
			if err := s.release(ctx); err != nil {
				s.b.log.Warn("releasing a killed sandbox's host resources (the next start retries)", "sandbox_id", s.id, "err", err)
			}
			s.b.releaseTimes.add(t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), time.Since(t3))
		})
	})
	return s.killErr
}

// killFrozen kills every task of a paused sandbox where it stands: a
// frozen task does not act on SIGKILL until thawed, so the tasks are
// killed while frozen (cgroup.kill on v2; on v1 each is signalled inside
// a freeze) and only then thawed, and no code of the sandbox runs again.
func (s *sandbox) killFrozen() error {
	if err := s.cg.Kill(); err != nil {
		return fmt.Errorf("killing paused sandbox %s: %w", s.id, err)
	}
	if err := s.cg.Thaw(); err != nil {
		return fmt.Errorf("killing paused sandbox %s: %w", s.id, err)
	}
	return nil
}
