package process

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/sysmon"
)

// reaper is the process-wide child reaper. The agent runs as PID 1, so
// every orphan in the sandbox becomes its child; a single goroutine calls
// wait4(-1, WNOHANG) on SIGCHLD, hands the status of the processes the
// agent started to their waiters, and simply reaps the rest.
//
// When the process is PID 1 or a child subreaper, nothing else in it may
// wait for children (no exec.Cmd.Wait, no os.Process.Wait): they would race
// with the reaper. Otherwise (the agent's handler used in-process) the
// reaper waits only for the pids it started, and other code may wait for
// its own children.
type reaper struct {
	// mu is held around every wait4 call and around fork+register, so a
	// child that exits at once is never reaped before its waiter exists.
	mu      sync.Mutex
	waiters map[int]func(unix.WaitStatus)
	oom     *oomScores // children's OOM score, set around each fork
}

var (
	theReaper     *reaper
	theReaperOnce sync.Once
)

// getReaper returns the process-wide reaper, starting it on first use.
func getReaper() *reaper {
	theReaperOnce.Do(func() {
		r := &reaper{waiters: make(map[int]func(unix.WaitStatus)), oom: newOOMScores()}
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGCHLD)
		go func() {
			for range ch {
				r.reapAll()
			}
		}()
		theReaper = r
	})
	return theReaper
}

// start forks with the reaper lock held and registers onExit for the
// new child before any wait4 can see it. The child starts with the OOM
// score of the agent's children (see oomScores).
func (r *reaper) start(fork func() (int, error), onExit func(unix.WaitStatus)) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	restore := r.oom.forChild()
	// The child starts with the kernel's default timer slack, whichever
	// this thread has (package sysmon).
	var (
		pid int
		err error
	)
	sysmon.Fork(func() { pid, err = fork() })
	restore()
	if err != nil {
		return 0, err
	}
	r.waiters[pid] = onExit
	return pid, nil
}

// awaitExit waits until the child pid, whose pidfd is f (non-blocking,
// in the poller), has exited, and reaps it unless the SIGCHLD loop has:
// the exit reaches its waiter from the poller, without the signal's trip
// through the runtime's signal goroutine, os/signal and the reaping
// goroutine. It returns once the child's onExit has run, or when the
// pidfd cannot tell (then the SIGCHLD loop delivers the exit).
func (r *reaper) awaitExit(pid int, f *os.File) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	first := true
	_ = rc.Read(func(uintptr) bool {
		done := r.reap(pid)
		if first && !done {
			first = false
			return false // wait until the pidfd is readable: the child exited
		}
		return true
	})
}

// reap reaps pid if it has exited and its waiter is still registered, and
// reports whether its waiter has run (now or before).
func (r *reaper) reap(pid int) bool {
	r.mu.Lock()
	fn, ok := r.waiters[pid]
	if !ok {
		r.mu.Unlock()
		return true
	}
	var ws unix.WaitStatus
	got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	for err == unix.EINTR {
		got, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
	if err != nil || got != pid {
		// Not exited yet (or reaped by other code of an in-process
		// agent, which reapOwn reports).
		r.mu.Unlock()
		return false
	}
	delete(r.waiters, pid)
	r.mu.Unlock()
	fn(ws)
	return true
}

// pidfdFile makes the pidfd of a child a pollable file; nil when there is
// none (a kernel without CLONE_PIDFD), or it cannot be made so.
func pidfdFile(fd int) *os.File {
	if fd < 0 {
		return nil
	}
	// F_SETFL ignores the access mode: O_NONBLOCK alone is the pidfd's
	// only status flag.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(fd)
		return nil
	}
	return os.NewFile(uintptr(fd), "pidfd")
}

func (r *reaper) reapAll() {
	if !reapsOrphans() {
		r.reapOwn()
		return
	}
	for {
		r.mu.Lock()
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			r.mu.Unlock()
			continue
		}
		if err != nil || pid <= 0 {
			r.mu.Unlock()
			return
		}
		fn := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if fn != nil {
			fn(ws)
		}
	}
}

// reapOwn waits only for the children the agent started: used when the
// agent is neither PID 1 nor a subreaper (in-process use, where other
// code may wait for its own children).
func (r *reaper) reapOwn() {
	type exit struct {
		fn func(unix.WaitStatus)
		ws unix.WaitStatus
	}
	var exits []exit
	r.mu.Lock()
	for pid, fn := range r.waiters {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if err == unix.ECHILD {
			ws = 0xffff // reaped by someone else: status unknown
		}
		if err == unix.ECHILD || (err == nil && got == pid) {
			delete(r.waiters, pid)
			exits = append(exits, exit{fn, ws})
		}
	}
	r.mu.Unlock()
	for _, e := range exits {
		e.fn(e.ws)
	}
}

// reapsOrphans reports whether orphans are reparented to this process: it
// is PID 1 (of its namespace) or a child subreaper.
func reapsOrphans() bool {
	if os.Getpid() == 1 {
		return true
	}
	var v int32
	err := unix.Prctl(unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&v)), 0, 0, 0)
	return err == nil && v != 0
}
