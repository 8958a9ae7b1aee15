package sandbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
)

// reaper kills sandboxes at their deadline, through the Manager
// (expirer). It owns what it is told between its rounds: the earliest
// deadline set since it last looked, or that it must look at them all.
// Its methods are safe for concurrent use; run runs once.
type reaper struct {
	wake chan struct{} // nudges run; buffered 1

	mu sync.Mutex
	// +checklocks:mu
	at time.Time
	// +checklocks:mu
	rescan bool
}

// expirer is what the reaper needs of the sandboxes it watches.
type expirer interface {
	// nextDeadline returns the earliest deadline of a running sandbox,
	// false if none has one.
	nextDeadline() (time.Time, bool)
	// reap kills or pauses every sandbox whose deadline has passed.
	reap(ctx context.Context)
}

func newReaper() *reaper { return &reaper{wake: make(chan struct{}, 1)} }

// nudge makes the reaper look at every sandbox's deadline again: after a
// change that may have made one earlier than it knew without saying which
// (a pause undone). Deadlines that go away or move later need no nudge:
// the reaper, woken early, finds nothing due and looks again.
func (r *reaper) nudge() {
	r.mu.Lock()
	r.rescan = true
	r.mu.Unlock()
	r.signal()
}

// nudgeAt tells the reaper of a running sandbox's new deadline at. The
// reaper does not go over the others for it, so that a create costs the
// same with thousands of sandboxes alive as with none.
func (r *reaper) nudgeAt(at time.Time) {
	r.mu.Lock()
	if r.at.IsZero() || at.Before(r.at) {
		r.at = at
	}
	r.mu.Unlock()
	r.signal()
}

func (r *reaper) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// take returns and clears what the nudges since the last call said.
func (r *reaper) take() (at time.Time, rescan bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, rescan = r.at, r.rescan
	r.at, r.rescan = time.Time{}, false
	return at, rescan
}

// run has x reap sandboxes at their deadlines until stop is closed. It
// sleeps until the earliest deadline it knows: it asks x for it when it
// starts, after each wake-up at a deadline and when nudged to; a deadline
// given with nudgeAt only moves its wake-up earlier.
func (r *reaper) run(stop <-chan struct{}, now func() time.Time, x expirer) {
	next, ok := x.nextDeadline()
	for {
		var (
			timer  *time.Timer
			timerC <-chan time.Time
		)
		if ok {
			timer = time.NewTimer(max(next.Sub(now()), 0))
			timerC = timer.C
		}
		select {
		case <-stop:
		case <-r.wake:
			at, rescan := r.take()
			if rescan {
				next, ok = x.nextDeadline()
			} else if !at.IsZero() && (!ok || at.Before(next)) {
				next, ok = at, true
			}
		case <-timerC:
			x.reap(context.Background())
			next, ok = x.nextDeadline()
		}
		if timer != nil {
			timer.Stop()
		}
		select {
		case <-stop:
			return
		default:
		}
	}
}

// nextDeadline implements expirer.
func (m *Manager) nextDeadline() (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var next time.Time
	for _, e := range m.running {
		end, ok := e.deadline()
		if ok && (next.IsZero() || end.Before(next)) {
			next = end
		}
	}
	return next, !next.IsZero()
}

// reap implements expirer: it kills every running sandbox whose deadline
// has passed, or pauses it if it was created with AutoPause (and kills it
// if the pause fails).
func (m *Manager) reap(ctx context.Context) {
	now := m.now()
	m.mu.Lock()
	var due []string
	pause := map[string]bool{}
	cold := map[string]bool{}
	for id, e := range m.running {
		if end, ok := e.deadline(); ok && !end.After(now) {
			due = append(due, id)
			e.mu.Lock()
			pause[id] = e.info.AutoPause
			cold[id] = e.info.AutoPauseNoMemory
			e.mu.Unlock()
		}
	}
	m.mu.Unlock()
	slices.Sort(due)
	for _, id := range due {
		if pause[id] {
			mem := WithMemory
			if cold[id] {
				mem = WithoutMemory
			}
			err := m.pauses.pause(ctx, id, "timeout", mem)
			if err == nil || errors.Is(err, api.ErrNotFound) || errors.Is(err, ErrClosed) || errors.Is(err, errNotRunning) {
				continue
			}
			m.log.ErrorContext(ctx, "pausing expired sandbox; killing it instead", "sandbox_id", id, "err", err)
		}
		err := m.kill(ctx, id, "timeout")
		if err != nil && !errors.Is(err, api.ErrNotFound) && !errors.Is(err, ErrClosed) {
			m.log.ErrorContext(ctx, "killing expired sandbox", "sandbox_id", id, "err", err)
		}
	}
}
