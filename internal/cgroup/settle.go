package cgroup

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Settling bounds, shared by the backends' pauses.
const (
	// SettleWait bounds how long Settle waits for the group to go idle: a
	// group busy all along (a CPU-bound loop, a shell loop forking every
	// tenth of a second) is let go after it, short enough that such a
	// sandbox is still stopped about where it was when asked.
	SettleWait = 500 * time.Millisecond
	// settleWindow is the period over which Settle samples the group's
	// CPU use: a window in which it used less than a tenth of a CPU, and
	// at whose end none of its tasks is runnable, is quiet. An idle
	// sandbox (its processes asleep or waiting on I/O) uses next to none;
	// starting a process (an exec, a login shell's profile, an
	// interpreter loading) uses most of a CPU, or waits on a run queue
	// for one when the host's CPUs are taken.
	settleWindow = 20 * time.Millisecond
	// settleQuiet is how long the group must stay quiet to be idle: a
	// start has short quiet gaps (waits on disk, on the host's CPUs when
	// they are busy) of a window or two.
	settleQuiet = 100 * time.Millisecond
)

// Settle returns once the group has been quiet for 100 ms (less than a
// tenth of a CPU in each 20 ms window and no task runnable at its end),
// after SettleWait, when done is closed or when ctx ends, and reports how
// long it waited and whether the group went quiet. A group whose usage
// cannot be read returns at once. A group starved of CPU by the host's
// other work is busy, not quiet, though it uses next to none: its tasks
// are runnable, waiting for a CPU. (Their time waiting is of no use here:
// the kernel adds a wait to it only once the wait ends.)
//
// A pause calls it before stopping a sandbox: a command started just
// before the pause has then got past its start (a login shell reading its
// profile, an interpreter loading) to its own work, a sleep or a server
// waiting, whose timers run on through the pause. Stopped inside its
// start, the command would begin that work only after the resume, late by
// the whole pause.
func (g *Group) Settle(ctx context.Context, done <-chan struct{}) (waited time.Duration, quiet bool) {
	start := time.Now()
	prev, err := g.Usage()
	if err != nil {
		return 0, false
	}
	prevAt, quietSince := start, start
	t := time.NewTicker(settleWindow)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return time.Since(start), false
		case <-done:
			return time.Since(start), false
		case <-t.C:
		}
		cur, err := g.Usage()
		if err != nil {
			return time.Since(start), false
		}
		now := time.Now()
		if (cur.CPUUsage-prev.CPUUsage)*10 >= now.Sub(prevAt) || g.runnable() {
			quietSince = now
		}
		switch {
		case now.Sub(quietSince) >= settleQuiet:
			return now.Sub(start), true
		case now.Sub(start) >= SettleWait:
			return now.Sub(start), false
		}
		prev, prevAt = cur, now
	}
}

// runnable reports whether one of the group's tasks (threads) is runnable
// now, running or waiting on a run queue for a CPU: state R in its
// /proc/TID/stat. A task gone since the listing is not; a group whose
// tasks cannot be listed has none.
func (g *Group) runnable() bool {
	dir, name := g.dir(""), "tasks"
	if g.v2() {
		name = "cgroup.threads"
	}
	tids, err := readFields(dir, name)
	if err != nil {
		return false
	}
	for _, tid := range tids {
		b, err := os.ReadFile("/proc/" + tid + "/stat")
		if err != nil {
			continue // gone since the listing
		}
		if statState(b) == 'R' {
			return true
		}
	}
	return false
}

// statState returns field 3 (state) of a /proc/PID/stat line, 0 when it
// has none.
func statState(b []byte) byte {
	rest, ok := statAfterComm(b)
	if !ok || len(rest) < 2 {
		return 0
	}
	return rest[1]
}

// SettleStarts is Settle for a group whose processes the host sees (not a
// gVisor sandbox's, which live inside its kernel): when none of them
// started within the last SettleWait there is no start to get past, and it
// returns at once (0, true) without sampling. A pause of an idle sandbox
// then costs a freeze, not a quiet window. A group whose processes cannot
// be listed is settled as Settle does.
func (g *Group) SettleStarts(ctx context.Context, done <-chan struct{}) (waited time.Duration, quiet bool) {
	pids, err := g.Pids()
	if err != nil || startedWithin(pids, SettleWait) {
		return g.Settle(ctx, done)
	}
	return 0, true
}

// userHZ is the unit of /proc/PID/stat's start time: the kernel reports it
// in USER_HZ, 100 on every architecture Linux runs fence on.
const userHZ = 100

// startedWithin reports whether any of pids started less than d ago (or
// its start cannot be read while it still exists, which counts as recent).
func startedWithin(pids []int, d time.Duration) bool {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return true
	}
	now := time.Duration(ts.Nano())
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone since the listing: not a start to wait for
		}
		if err != nil {
			return true
		}
		ticks, ok := statStartTime(b)
		if !ok || now-time.Duration(ticks)*(time.Second/userHZ) < d {
			return true
		}
	}
	return false
}

// statAfterComm returns what follows field 2 (the command name) of a
// /proc/PID/stat line: " STATE PPID ...". The command name may hold spaces
// and parentheses, so the fields are counted from the last ')'.
func statAfterComm(b []byte) ([]byte, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, false
	}
	return b[i+1:], true
}

// statStartTime returns field 22 (starttime) of a /proc/PID/stat line.
func statStartTime(b []byte) (int64, bool) {
	rest, ok := statAfterComm(b)
	if !ok {
		return 0, false
	}
	f := strings.Fields(string(rest))
	// After ')' come field 3 (state) onwards: starttime is field 22.
	if len(f) < 20 {
		return 0, false
	}
	v, err := strconv.ParseInt(f[19], 10, 64)
	return v, err == nil
}
