package process

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/sysmon"
)

// reaper is the process-wide child reaper. The agent runs as PID 1, so
// every orphan in the sandbox becomes its child.
//
// On a kernel whose pidfds keep a reaped child's exit status
// (PIDFD_INFO_EXIT, Linux 6.15), the reaper of a PID 1 or subreaper lets
// the kernel reap every child at its exit (SA_NOCLDWAIT on SIGCHLD) and
// reads the status of each process the agent started from its pidfd, in
// the poller: no thread waits for signals (os/signal keeps two for good)
// and no orphan is left a zombie. Elsewhere a single goroutine calls
// wait4(-1, WNOHANG) on SIGCHLD, hands the status of the processes the
// agent started to their waiters, and simply reaps the rest.
//
// When the process is PID 1 or a child subreaper, nothing else in it may
// wait for children (no exec.Cmd.Wait, no os.Process.Wait): they would race
// with the reaper, or find them reaped. Otherwise (the agent's handler used
// in-process) the reaper waits only for the pids it started, and other
// code may wait for its own children.
type reaper struct {
	// mu is held around every wait4 call and around fork+register, so a
	// child that exits at once is never reaped before its waiter exists.
	mu      sync.Mutex
	waiters map[int]func(unix.WaitStatus)
	oom     *oomScores // children's OOM score, set around each fork
	// autoReap is set when the kernel reaps the children (SA_NOCLDWAIT)
	// and their status is read from their pidfds.
	autoReap bool
}

var (
	theReaper     *reaper
	theReaperOnce sync.Once
)

// getReaper returns the process-wide reaper, starting it on first use.
func getReaper() *reaper {
	theReaperOnce.Do(func() {
		r := &reaper{waiters: make(map[int]func(unix.WaitStatus)), oom: newOOMScores()}
		if reapsOrphans() && exitInPidfd() && noChildWait() == nil {
			r.autoReap = true
			theReaper = r
			return
		}
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
// score of the agent's children (see oomScores). fork must make a pidfd
// of the child (SysProcAttr.PidFD) where the kernel has one, and its
// caller must hand it to awaitExit: when the kernel reaps the children,
// awaitExit alone delivers the exit.
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
	_ = rc.Read(func(fd uintptr) bool {
		done := r.reap(pid, int(fd))
		if r.autoReap {
			// Not done only while the pidfd is not readable.
			return done
		}
		if first && !done {
			first = false
			return false // wait until the pidfd is readable: the child exited
		}
		return true
	})
}

// reap reaps pid if it has exited and its waiter is still registered, and
// reports whether its waiter has run (now or before).
func (r *reaper) reap(pid int, pidfd int) bool {
	r.mu.Lock()
	fn, ok := r.waiters[pid]
	if !ok {
		r.mu.Unlock()
		return true
	}
	if r.autoReap {
		ws, exited := exitStatus(pidfd)
		if !exited {
			r.mu.Unlock()
			return false
		}
		delete(r.waiters, pid)
		r.mu.Unlock()
		fn(ws)
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
			ws = unknownStatus // reaped by someone else
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

// exitInPidfd reports whether the kernel keeps a child's exit status in
// its pidfd after the child is reaped (PIDFD_INFO_EXIT, Linux 6.15).
func exitInPidfd() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 6 || major == 6 && minor >= 15
}

// sigaction is the kernel's struct sigaction (the same on amd64 and
// arm64).
type sigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

// saNoCLDWait is SA_NOCLDWAIT: the children of a process whose SIGCHLD
// action has it are reaped by the kernel at their exit.
const saNoCLDWait = 0x2

// noChildWait adds SA_NOCLDWAIT to this process's SIGCHLD action, keeping
// the Go runtime's handler (which ignores the signal): the kernel reaps
// every child at its exit. A child the Go runtime forks gets the default
// action back before it executes (the runtime resets each signal it
// handles), so the processes the agent starts wait for their own children
// as usual.
func noChildWait() error {
	var act sigaction
	if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(unix.SIGCHLD), 0, uintptr(unsafe.Pointer(&act)), 8, 0, 0); e != 0 {
		return e
	}
	act.flags |= saNoCLDWait
	if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(unix.SIGCHLD), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); e != 0 {
		return e
	}
	return nil
}

// exitStatus reads the wait status of the process of pidfd, reaped by the
// kernel, and reports whether it has exited. An exit whose status the
// kernel has not recorded yet is waited for.
func exitStatus(pidfd int) (unix.WaitStatus, bool) {
	for i := 0; ; i++ {
		info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_EXIT}
		if err := unix.IoctlPidfdInfo(pidfd, &info); err == nil && info.Mask&unix.PIDFD_INFO_EXIT != 0 {
			return unix.WaitStatus(info.Exit_code), true
		}
		// A pidfd is readable once its process has exited.
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n == 0 {
			return 0, false
		}
		if i == 1000 {
			return unknownStatus, true
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// unknownStatus is the wait status of a child whose status could not be
// had: neither an exit nor a signal.
const unknownStatus = unix.WaitStatus(0xffff)

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
