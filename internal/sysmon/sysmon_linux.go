// Package sysmon lets the Go runtime's monitor thread of this process
// sleep longer between its rounds.
//
// The runtime's sysmon thread wakes every 20 µs while any goroutine is in
// a system call or running, for at least 50 rounds after each time it
// finds something to do or is woken from its deep sleep; it sleeps deeply
// only once every P is idle. A daemon or an agent that serves requests
// goes in and out of that state many times a second, and each round is a
// nanosleep: a context switch, which on a virtual machine of the kind
// fence runs on costs tens of microseconds of CPU, and the kernel's 50 µs
// default timer slack makes each 20 µs sleep last 70-150 µs anyway. A 1 ms
// slack for sysmon in the daemon, the spawner and every sandbox's init
// took a tenth off the machine's CPU time per API round trip (create, run
// a command, kill, back to back on two cores) and 30% off its context
// switches.
//
// Relax gives that one thread a larger timer slack, so that its short
// sleeps end when the kernel next has a timer to serve within the slack,
// or at its end. What sysmon does becomes later by at most the slack:
// taking the P of a goroutine blocked in a system call when other
// goroutines wait for one and none is idle (the wait is otherwise 20 µs to
// 10 ms), preempting a goroutine that ran for 10 ms, polling the network
// when no thread has for 10 ms, and the forced collection every two
// minutes.
//
// # Guarantees
//
//   - Relax changes the timer slack of the runtime's sysmon thread and of
//     no other thread, or nothing: the thread it changes is the first one
//     the runtime started after the main thread, and has been seen
//     sleeping in nanosleep or in a futex wait with a timeout, as sysmon
//     does between its rounds.
//   - Threads the runtime starts from sysmon later inherit its slack, as
//     a new thread does its creator's: their own timed waits (a spinning
//     thread's 3 µs pause, the poller's wait for the next timer) may end
//     up to the slack late. A process that keeps CAP_SYS_NICE (the
//     daemon) has Relax give them the main thread's slack back every
//     KeepEvery; one that drops it (an agent) keeps them so, which its
//     timers, all of seconds, do not feel. Fork keeps it from the
//     programs fence starts.
//   - Writing another thread's timer slack needs CAP_SYS_NICE in that
//     thread's user namespace; without it Relax returns an error and
//     changes nothing.
package sysmon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Default is the slack fence's processes give their sysmon thread.
const Default = time.Millisecond

// ForkSlack is the kernel's default timer slack, which the programs
// fence starts in a sandbox start with.
const ForkSlack = 50 * time.Microsecond

// Fork runs fork, which starts a process, on a thread whose timer slack
// is ForkSlack, so that the process starts with the kernel's default: a
// thread the runtime started from sysmon after Relax inherited sysmon's
// slack, and a child inherits its forking thread's.
func Fork(fork func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(ForkSlack.Nanoseconds()), 0, 0, 0)
	fork()
}

// readings bounds how many times Relax reads the candidate thread's
// system call before it gives up.
const readings = 20

// KeepEvery is how often a process that can (the daemon, as root) gives
// the threads that inherited sysmon's slack their own back.
const KeepEvery = 10 * time.Second

// Relax sets the timer slack of this process's sysmon thread to slack. It
// may wait a few milliseconds for sysmon to be seen sleeping, and gives up
// when ctx ends. procDir is the procfs mount to use ("/proc").
//
// With keepEvery > 0 it then runs until ctx ends, and every keepEvery
// gives the main thread's slack back to every other thread that has
// sysmon's: a thread the runtime starts from sysmon inherits it. Reading
// and writing the slack of those threads needs what setting sysmon's
// does, for as long as Relax runs.
func Relax(ctx context.Context, procDir string, slack, keepEvery time.Duration) error {
	if slack <= 0 {
		return fmt.Errorf("sysmon: timer slack %v: must be positive", slack)
	}
	leader, tid, err := find(ctx, procDir)
	if err != nil {
		return err
	}
	nominal, err := readSlack(procDir, leader)
	if err != nil {
		return err
	}
	if err := writeSlack(procDir, tid, slack.Nanoseconds()); err != nil {
		return err
	}
	if keepEvery <= 0 || nominal == slack.Nanoseconds() {
		return nil
	}
	t := time.NewTicker(keepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := restore(procDir, tid, slack.Nanoseconds(), nominal); err != nil {
			return err
		}
	}
}

// restore gives nominal back to every thread but sysmon whose slack is
// sysmon's.
func restore(procDir string, sysmon int, slack, nominal int64) error {
	ents, err := os.ReadDir(procDir + "/self/task")
	if err != nil {
		return fmt.Errorf("sysmon: listing threads: %w", err)
	}
	for _, e := range ents {
		t, err := strconv.Atoi(e.Name())
		if err != nil || t == sysmon {
			continue
		}
		if v, err := readSlack(procDir, t); err == nil && v == slack {
			if err := writeSlack(procDir, t, nominal); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// readSlack and writeSlack read and write thread tid's timer slack in
// nanoseconds. /proc/TID is the thread's own entry, hidden from listings
// but there.
func readSlack(procDir string, tid int) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("%s/%d/timerslack_ns", procDir, tid))
	if err != nil {
		return 0, fmt.Errorf("sysmon: reading the timer slack of thread %d: %w", tid, err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sysmon: the timer slack of thread %d: %w", tid, err)
	}
	return v, nil
}

func writeSlack(procDir string, tid int, ns int64) error {
	if err := os.WriteFile(fmt.Sprintf("%s/%d/timerslack_ns", procDir, tid), []byte(strconv.FormatInt(ns, 10)), 0); err != nil {
		return fmt.Errorf("sysmon: setting the timer slack of thread %d: %w", tid, err)
	}
	return nil
}

// find returns the thread id of the runtime's sysmon thread: the first
// thread the runtime starts (runtime.main starts it before any other and
// before any package's init runs), so the one whose id follows the main
// thread's most closely (ids are handed out in increasing order, wrapping
// at pid_max), once it has been seen in a timed sleep.
func find(ctx context.Context, procDir string) (leader, tid int, err error) {
	task := procDir + "/self/task"
	// The main thread's id as this procfs numbers it: a process in a pid
	// namespace of its own may read its parent namespace's.
	self, err := os.Readlink(procDir + "/self")
	if err != nil {
		return 0, 0, fmt.Errorf("sysmon: %w", err)
	}
	if leader, err = strconv.Atoi(self); err != nil {
		return 0, 0, fmt.Errorf("sysmon: %s/self is %q", procDir, self)
	}
	// Usually no other thread on the host was started in between: the id
	// right after the main thread's, if it is a thread of this process,
	// is the closest there can be, and the listing is not needed.
	if next := leader + 1; next < pidMaxLimit {
		if _, err := os.Stat(fmt.Sprintf("%s/%d", task, next)); err == nil {
			tid = next
		}
	}
	if tid == 0 {
		ents, err := os.ReadDir(task)
		if err != nil {
			return 0, 0, fmt.Errorf("sysmon: listing threads: %w", err)
		}
		for _, e := range ents {
			t, err := strconv.Atoi(e.Name())
			if err != nil || t == leader {
				continue
			}
			if tid == 0 || after(leader, t) < after(leader, tid) {
				tid = t
			}
		}
	}
	if tid == 0 {
		return 0, 0, errors.New("sysmon: the process has one thread")
	}
	// Sysmon spends nearly all its time asleep: a candidate never seen so
	// is not it (the ids wrapped twice, or the runtime changed).
	path := fmt.Sprintf("%s/%d/syscall", task, tid)
	t := time.NewTimer(0)
	defer t.Stop()
	for range readings {
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-t.C:
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return 0, 0, fmt.Errorf("sysmon: reading thread %d: %w", tid, err)
		}
		if timedSleep(string(raw)) {
			return leader, tid, nil
		}
		t.Reset(200 * time.Microsecond)
	}
	return 0, 0, fmt.Errorf("sysmon: thread %d, the first the runtime started, was never seen in a timed sleep", tid)
}

// pidMaxLimit is the largest pid_max Linux allows (PID_MAX_LIMIT on
// 64-bit systems): every thread id is below it.
const pidMaxLimit = 1 << 22

// after is how far thread id t comes after id leader in allocation order.
func after(leader, t int) int {
	if t > leader {
		return t - leader
	}
	return t + pidMaxLimit - leader
}

// timedSleep reports whether a line of /proc/TID/syscall ("NR arg1 ...
// arg6 sp pc") is a nanosleep or a futex wait with a timeout.
func timedSleep(line string) bool {
	f := strings.Fields(line)
	if len(f) < 5 {
		return false // "running", or not in a system call
	}
	nr, err := strconv.Atoi(f[0])
	if err != nil {
		return false
	}
	switch nr {
	case unix.SYS_NANOSLEEP:
		return true
	case unix.SYS_FUTEX:
		op, err1 := strconv.ParseUint(strings.TrimPrefix(f[2], "0x"), 16, 64)
		timeout, err2 := strconv.ParseUint(strings.TrimPrefix(f[4], "0x"), 16, 64)
		const futexWait, futexCmdMask = 0, 0x7f // FUTEX_WAIT, ~(PRIVATE|CLOCK_REALTIME)
		return err1 == nil && err2 == nil && op&futexCmdMask == futexWait && timeout != 0
	}
	return false
}
