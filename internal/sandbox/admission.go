package sandbox

import (
	"context"
	"fmt"
	"sync"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/capacity"
)

// admission decides whether one more sandbox may start. It owns the count
// of the units of Options.MaxSandboxes in use: sandboxes live (running or
// paused), being created (admitted, not registered yet), being killed
// (until the backend has released them) and held ahead of demand (a warm
// pool's, PoolBudget), and asks the host for headroom
// (Options.Capacity). The Manager tells it of each registration and
// removal under the lock that guards its registry, so the count never
// misses a sandbox that moves from one kind to another. Its methods are
// safe for concurrent use and never call back into the Manager.
type admission struct {
	max  int
	gate *capacity.Gate // nil admits anything the count allows
	pool reclaimer      // the backend, if it holds sandboxes started ahead

	// serial serialises reserve, so that each sees the creates admitted
	// before it in pending.
	serial sync.Mutex

	mu sync.Mutex
	// +checklocks:mu
	started bool // reserve admits from Manager.Start on
	// +checklocks:mu
	closed bool // nothing is admitted after Manager.Shutdown
	// +checklocks:mu
	live int // sandboxes registered, running or paused
	// +checklocks:mu
	pending int // creates between their admission and their registration
	// +checklocks:mu
	pooled int // sandboxes started ahead of demand (PoolBudget units)
	// +checklocks:mu
	dying int // sandboxes removed whose kill has not returned yet
}

// reclaimer is implemented by a backend that keeps sandboxes started ahead
// of demand, each holding a unit of the PoolBudget (warm.Pool): Reclaim
// kills one and hands its unit to the caller, reporting whether it did.
type reclaimer interface {
	Reclaim(ctx context.Context) bool
}

func newAdmission(max int, gate *capacity.Gate, backend any) *admission {
	pool, _ := backend.(reclaimer)
	return &admission{max: max, gate: gate, pool: pool}
}

// start opens admission to creates (Manager.Start).
func (a *admission) start() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.started = true
}

// close refuses every create and pool unit from now on (Manager.Shutdown).
func (a *admission) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
}

// reserve takes one unit of capacity for a create, once the host has
// headroom for it and every create in flight (Options.Capacity). At the
// cap, or short of headroom, a unit held by a sandbox started ahead of
// demand is taken back from the backend (a warm pool kills one of its
// sandboxes for it, which frees its share of the host too). The unit is
// given back with cancel, or becomes a live sandbox's with register.
func (a *admission) reserve(ctx context.Context) error {
	a.serial.Lock()
	defer a.serial.Unlock()
	a.mu.Lock()
	switch {
	case a.closed:
		a.mu.Unlock()
		return ErrClosed
	case !a.started:
		a.mu.Unlock()
		return errNotStarted
	}
	// The unit is taken first (pending), then the host asked, so that the
	// count never goes past the cap while the host is read; a refusal
	// gives it back.
	counted := a.usedLocked() < a.max
	if counted {
		a.pending++
	}
	inFlight, pooled := a.aheadLocked()-1, a.pooled
	a.mu.Unlock()
	var refused error
	if counted {
		if refused = a.admit(inFlight); refused == nil {
			return nil
		}
		a.cancel()
	}
	for pooled > 0 {
		if a.pool == nil || !a.pool.Reclaim(ctx) {
			break
		}
		a.mu.Lock()
		a.pooled-- // the reclaimed sandbox's unit, handed to this create
		a.pending++
		inFlight, pooled = a.aheadLocked()-1, a.pooled
		a.mu.Unlock()
		if refused = a.admit(inFlight); refused == nil {
			return nil
		}
		a.cancel()
	}
	if refused != nil {
		a.gate.Count(refused)
		return refused
	}
	return fmt.Errorf("the limit of %d concurrent sandboxes is reached: %w", a.max, api.ErrResourceExhausted)
}

// cancel gives back a unit reserve took, for a create that failed.
func (a *admission) cancel() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending--
}

// register makes a unit reserve took a live sandbox's.
func (a *admission) register() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending--
	a.live++
}

// adopt counts a live sandbox that no create admitted (one taken over
// from a previous daemon).
func (a *admission) adopt() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.live++
}

// remove counts a live sandbox removed from the registry as dying: its
// unit is held until released, once the backend has freed it.
func (a *admission) remove() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.live--
	a.dying++
}

// released gives back the unit of a removed sandbox whose kill returned.
func (a *admission) released() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dying--
}

// status returns the host's capacity left, false without a gate.
func (a *admission) status() (capacity.Status, bool) {
	if a.gate == nil {
		return capacity.Status{}, false
	}
	return a.gate.Status(), true
}

// admit asks the gate for one more sandbox beside inFlight others.
func (a *admission) admit(inFlight int) error {
	if a.gate == nil {
		return nil
	}
	return a.gate.Check(inFlight)
}

// admitBoot admits the boot of a sandbox already counted (the resume of
// a filesystem-only pause) against the gate, counting a refusal.
func (a *admission) admitBoot() error {
	if a.gate == nil {
		return nil
	}
	a.mu.Lock()
	inFlight := a.aheadLocked()
	a.mu.Unlock()
	err := a.gate.Check(inFlight)
	a.gate.Count(err)
	return err
}

// aheadLocked is what the host may not show yet: creates in flight, and
// the units of sandboxes started ahead of demand, which a pool may be
// starting still (those it has started are counted twice: a create short
// of headroom takes them back first).
//
// +checklocks:a.mu
func (a *admission) aheadLocked() int { return a.pending + a.pooled }

// admitAhead reports whether a sandbox started ahead of demand (a warm
// pool's, a standby) may start: it must leave capacity.PoolReserve
// creates' headroom beside what is ahead already.
func (a *admission) admitAhead() bool {
	if a.gate == nil {
		return true
	}
	a.mu.Lock()
	inFlight := a.aheadLocked()
	a.mu.Unlock()
	return a.gate.CheckPool(inFlight) == nil
}

// inFlight is the number of creates admitted and not registered yet.
func (a *admission) inFlight() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pending
}

// usedLocked is the capacity in use: sandboxes live, being created,
// being killed, and held ahead of demand.
//
// +checklocks:a.mu
func (a *admission) usedLocked() int {
	return a.live + a.pending + a.dying + a.pooled
}

// Capacity returns the host's capacity left (Options.Capacity), false
// without one.
func (m *Manager) Capacity() (capacity.Status, bool) { return m.adm.status() }

// CreatesInFlight is the number of creates past their capacity check
// and not yet recorded (a template tree they resolved may not be named by
// any sandbox record yet).
func (m *Manager) CreatesInFlight() int { return m.adm.inFlight() }

// PoolBudget counts sandboxes started ahead of demand (a warm pool's)
// against MaxSandboxes, like running ones. The pool's backend must be this
// Manager's (or wrap it), so that Create can reclaim their units.
type PoolBudget struct{ a *admission }

// PoolBudget returns the budget a warm pool in front of the backend draws
// from.
func (m *Manager) PoolBudget() PoolBudget { return PoolBudget{m.adm} }

// TryAcquire takes one unit, reporting false at the cap, short of the
// headroom Options.Capacity keeps for users' creates, or after Shutdown.
func (b PoolBudget) TryAcquire() bool {
	a := b.a
	a.mu.Lock()
	if a.closed || a.usedLocked() >= a.max {
		a.mu.Unlock()
		return false
	}
	// The unit is taken before the host is read, and the host read outside
	// the lock (a few /proc files, at every refill), as a create's reserve
	// does: a create meanwhile counts the unit, and no caller waits on the
	// lock for the reading.
	a.pooled++
	inFlight := a.aheadLocked() - 1
	a.mu.Unlock()
	if a.gate == nil || a.gate.CheckPool(inFlight) == nil {
		return true
	}
	a.mu.Lock()
	a.pooled--
	a.mu.Unlock()
	return false
}

// Release gives back a unit taken with TryAcquire.
func (b PoolBudget) Release() {
	a := b.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pooled > 0 {
		a.pooled--
	}
}
