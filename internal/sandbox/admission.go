package sandbox

import (
	"context"
	"fmt"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/capacity"
	"github.com/fencesandbox/fence/internal/isolation"
)

// reserve takes one unit of capacity for a create, once the host has
// headroom for it and every create in flight (Options.Capacity). At the
// cap, or short of headroom, a unit held by a sandbox started ahead of
// demand is taken back from the backend (a warm pool kills one of its
// sandboxes for it, which frees its share of the host too).
func (m *Manager) reserve(ctx context.Context) error {
	m.admitMu.Lock()
	defer m.admitMu.Unlock()
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		return ErrClosed
	case !m.started:
		m.mu.Unlock()
		return errNotStarted
	}
	// The unit is taken first (pending), then the host asked, so that the
	// count never goes past the cap while the host is read; a refusal
	// gives it back.
	counted := m.usedLocked() < m.max
	if counted {
		m.pending++
	}
	inFlight, pooled := m.aheadLocked()-1, m.pooled
	m.mu.Unlock()
	var refused error
	if counted {
		if refused = m.admit(inFlight); refused == nil {
			return nil
		}
		m.mu.Lock()
		m.pending--
		m.mu.Unlock()
	}
	for pooled > 0 {
		r, ok := m.backend.(reclaimer)
		if !ok || !r.Reclaim(ctx) {
			break
		}
		m.mu.Lock()
		m.pooled-- // the reclaimed sandbox's unit, handed to this create
		m.pending++
		inFlight, pooled = m.aheadLocked()-1, m.pooled
		m.mu.Unlock()
		if refused = m.admit(inFlight); refused == nil {
			return nil
		}
		m.mu.Lock()
		m.pending--
		m.mu.Unlock()
	}
	if refused != nil {
		m.capacity.Count(refused)
		return refused
	}
	return fmt.Errorf("the limit of %d concurrent sandboxes is reached: %w", m.max, api.ErrResourceExhausted)
}

// Capacity returns the host's capacity left (Options.Capacity), false
// without one.
func (m *Manager) Capacity() (capacity.Status, bool) {
	if m.capacity == nil {
		return capacity.Status{}, false
	}
	return m.capacity.Status(), true
}

// admit asks Options.Capacity for one more sandbox beside inFlight
// others.
func (m *Manager) admit(inFlight int) error {
	if m.capacity == nil {
		return nil
	}
	return m.capacity.Check(inFlight)
}

// admitBoot admits the boot of a sandbox already counted (the resume of
// a filesystem-only pause) against Options.Capacity, counting a refusal.
func (m *Manager) admitBoot() error {
	if m.capacity == nil {
		return nil
	}
	m.mu.Lock()
	inFlight := m.aheadLocked()
	m.mu.Unlock()
	err := m.capacity.Check(inFlight)
	m.capacity.Count(err)
	return err
}

// aheadLocked is what the host may not show yet: creates in flight, and
// the units of sandboxes started ahead of demand, which a pool may be
// starting still (those it has started are counted twice: a create short
// of headroom takes them back first).
//
// +checklocks:m.mu
func (m *Manager) aheadLocked() int { return m.pending + m.pooled }

// admitAhead reports whether a sandbox started ahead of demand (a warm
// pool's, a standby) may start: it must leave capacity.PoolReserve
// creates' headroom.
//
// +checklocks:m.mu
func (m *Manager) admitAhead(inFlight int) bool {
	return m.capacity == nil || m.capacity.CheckPool(inFlight) == nil
}

// CreatesInFlight is the number of creates past their capacity check
// and not yet recorded (a template tree they resolved may not be named by
// any sandbox record yet).
func (m *Manager) CreatesInFlight() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pending
}

// usedLocked is the capacity in use: sandboxes running, being created,
// being killed, and held ahead of demand.
//
// +checklocks:m.mu
func (m *Manager) usedLocked() int {
	return len(m.running) + m.pending + m.dying + m.pooled
}

// killRemoved kills a sandbox just removed from running; its capacity is
// counted (dying) until the backend has released it.
func (m *Manager) killRemoved(ctx context.Context, box isolation.Sandbox) {
	defer func() {
		m.mu.Lock()
		m.dying--
		m.mu.Unlock()
	}()
	m.killBox(ctx, box)
}

// reclaimer is implemented by a backend that keeps sandboxes started ahead
// of demand, each holding a unit of the PoolBudget (warm.Pool): Reclaim
// kills one and hands its unit to the caller, reporting whether it did.
type reclaimer interface {
	Reclaim(ctx context.Context) bool
}

// PoolBudget counts sandboxes started ahead of demand (a warm pool's)
// against MaxSandboxes, like running ones. The pool's backend must be this
// Manager's (or wrap it), so that Create can reclaim their units.
type PoolBudget struct{ m *Manager }

// PoolBudget returns the budget a warm pool in front of the backend draws
// from.
func (m *Manager) PoolBudget() PoolBudget { return PoolBudget{m} }

// TryAcquire takes one unit, reporting false at the cap, short of the
// headroom Options.Capacity keeps for users' creates, or after Shutdown.
func (b PoolBudget) TryAcquire() bool {
	m := b.m
	m.mu.Lock()
	if m.closed || m.usedLocked() >= m.max {
		m.mu.Unlock()
		return false
	}
	// The unit is taken before the host is read, and the host read outside
	// the lock (a few /proc files, at every refill), as a create's reserve
	// does: a create meanwhile counts the unit, and no caller waits on the
	// manager's lock for the reading.
	m.pooled++
	inFlight := m.aheadLocked() - 1
	m.mu.Unlock()
	if m.capacity == nil || m.capacity.CheckPool(inFlight) == nil {
		return true
	}
	m.mu.Lock()
	m.pooled--
	m.mu.Unlock()
	return false
}

// Release gives back a unit taken with TryAcquire.
func (b PoolBudget) Release() {
	m := b.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pooled > 0 {
		m.pooled--
	}
}
