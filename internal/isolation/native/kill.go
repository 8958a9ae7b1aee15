package native

import (
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
