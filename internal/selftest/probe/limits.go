package probe

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

func positiveArg(args []string, max int64) (int64, error) {
	if len(args) != 1 {
		return 0, fmt.Errorf("%w: want one number", errUsage)
	}
	n, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || n <= 0 || n > max {
		return 0, fmt.Errorf("%w: %q is not a number in 1..%d", errUsage, args[0], max)
	}
	return n, nil
}

// checkPidsLimit forks paused children until fork fails. The sandbox's
// pids limit MAX counts every task in it (the agent's and the probe's
// threads too), so fork must fail with EAGAIN before MAX children exist.
// The children are killed as soon as fork fails or MAX is reached, so the
// sandbox is at its limit only for an instant.
//
// While the sandbox is at its limit the Go runtime must not need a new
// thread (it cannot survive failing to make one): one P, no GC, no
// allocation, and only raw system calls, which never hand the P over to
// another thread.
func checkPidsLimit(args []string) error {
	max, err := positiveArg(args, 1<<16)
	if err != nil {
		return err
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	// The children are copies of this thread: it must stay the same
	// thread (their parent-death signal follows it), and no signal
	// handler may run in a child, so every signal is blocked across the
	// forks.
	runtime.LockOSThread()
	pids := make([]int, 0, max)
	var all, old unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^uint64(0)
	}
	if err := unix.PthreadSigmask(unix.SIG_SETMASK, &all, &old); err != nil {
		return fmt.Errorf("blocking signals: %w", err)
	}
	var ferr syscall.Errno
	for int64(len(pids)) < max {
		pid, e := forkPaused()
		if e != 0 {
			ferr = e
			break
		}
		pids = append(pids, pid)
	}
	for _, p := range pids {
		syscall.RawSyscall(syscall.SYS_KILL, uintptr(p), uintptr(syscall.SIGKILL), 0)
	}
	for _, p := range pids {
		syscall.RawSyscall6(syscall.SYS_WAIT4, uintptr(p), 0, 0, 0, 0, 0)
	}
	unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
	switch {
	case ferr == unix.EAGAIN:
		return nil
	case ferr != 0:
		return fmt.Errorf("fork failed with %v after %d processes, before the limit", ferr, len(pids))
	default:
		return escapef("forked %d processes under a limit of %d tasks", len(pids), max)
	}
}

// forkPaused forks a child that only waits to be killed. The child is a
// copy of a multi-threaded Go process with only this thread: it must run
// nothing but raw system calls, hence nosplit and no allocation.
//
//go:nosplit
//go:norace
func forkPaused() (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	if r == 0 {
		syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0)
		for {
			syscall.RawSyscall(syscall.SYS_PAUSE, 0, 0, 0)
		}
	}
	return int(r), 0
}

// checkMemoryLimit allocates and touches up to twice BYTES, the sandbox's
// memory limit, in 1 MiB chunks. The kernel must kill it on the way; the
// bound keeps a sandbox without a limit from taking the host's memory.
func checkMemoryLimit(args []string) error {
	limit, err := positiveArg(args, 1<<40)
	if err != nil {
		return err
	}
	const chunk = 1 << 20
	var hold [][]byte
	for int64(len(hold))*chunk < 2*limit {
		b := make([]byte, chunk)
		for i := 0; i < len(b); i += 4096 {
			b[i] = byte(i)
		}
		hold = append(hold, b)
	}
	return escapef("allocated %d MiB under a limit of %d MiB", len(hold), limit>>20)
}
