package cgroup

import (
	"context"
	"time"
)

// Settling bounds, shared by the backends' pauses.
const (
	// SettleWait bounds how long Settle waits for the group to go idle: a
	// group busy all along (a CPU-bound loop, a shell loop forking every
	// tenth of a second) is let go after it, short enough that such a
	// sandbox is still stopped about where it was when asked.
	SettleWait = 500 * time.Millisecond
	// settleWindow is the period over which Settle samples the group's
	// CPU use: a window in which it used less than a tenth of a CPU is
	// quiet. An idle sandbox (its processes asleep or waiting) uses next
	// to none; starting a process (an exec, a login shell's profile, an
	// interpreter loading) uses most of a CPU.
	settleWindow = 20 * time.Millisecond
	// settleQuiet is how long the group must stay quiet to be idle: a
	// start has short quiet gaps (waits on disk, on the host's CPUs when
	// they are busy) of a window or two.
	settleQuiet = 100 * time.Millisecond
)

// Settle returns once the group has been quiet for 100 ms (less than a
// tenth of a CPU in each 20 ms window), after SettleWait, when done is
// closed or when ctx ends, and reports how long it waited and whether the
// group went quiet. A group whose usage cannot be read returns at once.
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
		if (cur.CPUUsage-prev.CPUUsage)*10 >= now.Sub(prevAt) {
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
