// Package idle tracks how recently each running sandbox was used and has
// the ones left idle past their idle timeout paused (fence's
// lifecycle.idleTimeout and `fence serve --idle-pause`).
//
// # Guarantees
//
//   - A sandbox counts as used while a request or session for it is in
//     flight (Begin until its end), when one arrives (Touch, Begin), and
//     between two checks in which its processes used more than
//     Options.CPUThreshold of a CPU (its cgroup's usage, Candidate.CPU).
//   - A running sandbox with an idle timeout that was not used for that
//     long is paused through Core.Pause, which checks Quiet once more
//     under the sandbox's lifecycle lock: a request that begins before
//     that check keeps it running.
//   - Marking use is cheap on the hot path: a lock-free map read and an
//     atomic store (Touch), or two atomic adds (Begin); nothing on it
//     waits for the checking loop.
//   - A sandbox's record goes once it is no longer a candidate (paused,
//     killed, no idle timeout) and nothing is in flight for it; the run
//     that follows starts its idle clock anew.
package idle

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Candidate is a running sandbox with an idle timeout, as the Core lists it.
type Candidate struct {
	ID string
	// Timeout is its idle timeout (> 0).
	Timeout time.Duration
	// Since is the start of its current run: no idle time is counted
	// before it.
	Since time.Time
	// Incarnation names the backend sandbox running it (its CPU counter
	// starts anew when it changes).
	Incarnation uint64
	// CPU reads the cumulative CPU time of its processes.
	CPU func(ctx context.Context) (time.Duration, error)
}

// Core is what the Tracker needs of the sandbox manager.
type Core interface {
	// Candidates returns the running sandboxes that have an idle timeout.
	Candidates() []Candidate
	// Pause pauses sandbox id for idleness, keeping its memory where the
	// backend can, unless quiet, called under the sandbox's lifecycle
	// lock just before the pause, reports false.
	Pause(ctx context.Context, id string, quiet func() bool) error
}

// ErrCannotPause is what Core.Pause returns (wrapped) for a sandbox whose
// backend cannot pause it: the Tracker stops trying for that run.
var ErrCannotPause = errors.New("the backend cannot pause this sandbox")

// Options configure a Tracker.
type Options struct {
	// CPUThreshold is the share of one CPU (0.05 is 5 %) above which a
	// sandbox's processes count as busy between two checks; 0 means 0.05.
	CPUThreshold float64
	// Every is the longest time between two checks; 0 means 1 s. A check
	// runs at least four times per smallest idle timeout (but not more
	// often than every 100 ms).
	Every time.Duration
	// Logger; nil discards logs.
	Logger *slog.Logger
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// Tracker tracks the use of sandboxes and pauses idle ones. Bind it to a
// Core, then Run it. Its methods are safe for concurrent use.
type Tracker struct {
	threshold float64
	every     time.Duration
	log       *slog.Logger
	now       func() time.Time

	core atomic.Pointer[Core]
	acts sync.Map // sandbox ID → *activity
}

// activity is one sandbox's use.
type activity struct {
	last atomic.Int64 // unix nanoseconds of the last use
	busy atomic.Int64 // requests and sessions in flight

	// The checking loop's alone.
	cpu     time.Duration // CPU time at the last check
	cpuAt   time.Time     // when it was read; zero: none yet
	inc     uint64        // the incarnation it was read from
	refused bool          // the backend cannot pause this run
}

// New returns a Tracker.
func New(o Options) *Tracker {
	t := &Tracker{threshold: cmp.Or(o.CPUThreshold, 0.05), every: cmp.Or(o.Every, time.Second), log: o.Logger, now: o.Now}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.now == nil {
		t.now = time.Now
	}
	return t
}

// Bind binds t to the manager whose sandboxes it pauses (once).
func (t *Tracker) Bind(c Core) {
	if !t.core.CompareAndSwap(nil, &c) {
		panic("idle.Tracker bound twice")
	}
}

// get returns id's record, made if missing.
func (t *Tracker) get(id string) *activity {
	if a, ok := t.acts.Load(id); ok {
		return a.(*activity)
	}
	a := &activity{}
	a.last.Store(t.now().UnixNano())
	v, _ := t.acts.LoadOrStore(id, a)
	return v.(*activity)
}

// Touch marks sandbox id used now.
func (t *Tracker) Touch(id string) {
	if t == nil {
		return
	}
	t.get(id).last.Store(t.now().UnixNano())
}

// Begin marks sandbox id used until end is called (a request in flight,
// an SSH session); end is idempotent.
func (t *Tracker) Begin(id string) (end func()) {
	if t == nil {
		return func() {}
	}
	a := t.get(id)
	a.last.Store(t.now().UnixNano())
	a.busy.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			a.last.Store(t.now().UnixNano())
			a.busy.Add(-1)
		})
	}
}

// Run checks the candidates until stop is closed.
func (t *Tracker) Run(stop <-chan struct{}) {
	timer := time.NewTimer(t.every)
	defer timer.Stop()
	for {
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		timer.Reset(t.Check(context.Background()))
	}
}

// Check runs one check: it reads the candidates' CPU use, pauses the ones
// idle past their timeout and forgets the sandboxes that are no longer
// candidates. It returns when the next check is due.
func (t *Tracker) Check(ctx context.Context) time.Duration {
	cp := t.core.Load()
	if cp == nil {
		return t.every
	}
	core := *cp
	next := t.every
	live := map[string]bool{}
	for _, c := range core.Candidates() {
		live[c.ID] = true
		next = min(next, max(c.Timeout/4, 100*time.Millisecond))
		a := t.get(c.ID)
		if c.Incarnation != a.inc {
			a.inc, a.cpuAt, a.refused = c.Incarnation, time.Time{}, false
		}
		if a.refused {
			continue
		}
		now := t.now()
		if used, err := c.CPU(ctx); err == nil {
			if !a.cpuAt.IsZero() && used >= a.cpu {
				if float64(used-a.cpu) > t.threshold*float64(now.Sub(a.cpuAt)) {
					a.last.Store(now.UnixNano())
				}
			}
			a.cpu, a.cpuAt = used, now
		}
		if !t.quiet(a, c, now) {
			continue
		}
		err := core.Pause(ctx, c.ID, func() bool { return t.quiet(a, c, t.now()) })
		switch {
		case err == nil:
			t.log.InfoContext(ctx, "idle sandbox paused", "sandbox_id", c.ID, "idle_timeout", c.Timeout)
		case errors.Is(err, ErrCannotPause):
			a.refused = true
			t.log.WarnContext(ctx, "idle sandbox left running: its backend cannot pause it", "sandbox_id", c.ID)
		case errors.Is(err, ErrNotQuiet):
		default:
			t.log.DebugContext(ctx, "idle sandbox not paused", "sandbox_id", c.ID, "err", err)
		}
	}
	t.acts.Range(func(k, v any) bool {
		if !live[k.(string)] && v.(*activity).busy.Load() == 0 {
			t.acts.Delete(k)
		}
		return true
	})
	return next
}

// ErrNotQuiet is what Core.Pause returns (wrapped) when quiet reported
// false: the sandbox was used meanwhile and runs on.
var ErrNotQuiet = errors.New("sandbox used meanwhile")

// quiet reports whether the sandbox of a, candidate c, has been idle for
// its timeout at now.
func (t *Tracker) quiet(a *activity, c Candidate, now time.Time) bool {
	if a.busy.Load() > 0 {
		return false
	}
	last := time.Unix(0, a.last.Load())
	if c.Since.After(last) {
		last = c.Since
	}
	return now.Sub(last) >= c.Timeout
}
