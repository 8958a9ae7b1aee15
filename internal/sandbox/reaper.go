package sandbox

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/fencesandbox/fence/api"
)

// nudge makes the reaper look at every sandbox's deadline again: after a
// change that may have made one earlier than it knew without saying which
// (a pause undone). Deadlines that go away or move later need no nudge:
// the reaper, woken early, finds nothing due and looks again.
func (m *Manager) nudge() {
	m.wakeMu.Lock()
	m.wakeRescan = true
	m.wakeMu.Unlock()
	m.signalReaper()
}

// nudgeAt tells the reaper of a running sandbox's new deadline at. The
// reaper does not go over the others for it, so that a create costs the
// same with thousands of sandboxes alive as with none.
func (m *Manager) nudgeAt(at time.Time) {
	m.wakeMu.Lock()
	if m.wakeAt.IsZero() || at.Before(m.wakeAt) {
		m.wakeAt = at
	}
	m.wakeMu.Unlock()
	m.signalReaper()
}

func (m *Manager) signalReaper() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// takeWake returns and clears what the nudges since the last call said.
func (m *Manager) takeWake() (at time.Time, rescan bool) {
	m.wakeMu.Lock()
	defer m.wakeMu.Unlock()
	at, rescan = m.wakeAt, m.wakeRescan
	m.wakeAt, m.wakeRescan = time.Time{}, false
	return at, rescan
}

// reaper kills sandboxes at their deadline. It sleeps until the earliest
// deadline it knows: it goes over all the sandboxes when it starts, after
// each wake-up at a deadline and when nudged to; a deadline given with
// nudgeAt only moves its wake-up earlier.
func (m *Manager) reaper() {
	next, ok := m.nextDeadline()
	for {
		var (
			timer  *time.Timer
			timerC <-chan time.Time
		)
		if ok {
			timer = time.NewTimer(max(next.Sub(m.now()), 0))
			timerC = timer.C
		}
		select {
		case <-m.stop:
		case <-m.wake:
			at, rescan := m.takeWake()
			if rescan {
				next, ok = m.nextDeadline()
			} else if !at.IsZero() && (!ok || at.Before(next)) {
				next, ok = at, true
			}
		case <-timerC:
			m.reap(context.Background())
			next, ok = m.nextDeadline()
		}
		if timer != nil {
			timer.Stop()
		}
		select {
		case <-m.stop:
			return
		default:
		}
	}
}

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

// reap kills every running sandbox whose deadline has passed, or pauses it
// if it was created with AutoPause (and kills it if the pause fails).
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
			pauseFn := m.pause
			if cold[id] {
				pauseFn = m.pauseCold
			}
			err := pauseFn(ctx, id, "timeout")
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
