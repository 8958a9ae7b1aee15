// Package warm keeps sandboxes of one template and one set of limits
// started ahead of demand, so that a create of that kind only has to hand
// one out and configure its agent.
//
// Pool wraps an isolation.Backend and is one itself. Start names what it
// keeps (the daemon passes its default template and default limits) and
// the Budget its sandboxes count against. A Create whose Spec has exactly
// that RootFS and those Limits, no ID and no binds may be served from the
// pool; every other Create goes straight to the backend and never makes the
// pool start anything. A pooled sandbox is already named (its ID is its
// hostname and cannot change later). The agent configuration of the
// request is then delivered to the agent over its connection (POST /init),
// which the daemon's proxy never forwards from outside.
//
// # Guarantees
//
//   - A pooled sandbox has run nothing but its agent; it is handed out once.
//   - The pool holds at most Size sandboxes (ready or being started), all
//     of the one (template, limits) given to Start.
//   - Every pooled sandbox holds one unit of the Budget from before it is
//     started until it is handed out (the unit is released: the create that
//     takes it holds its own) or killed. When the Budget has no unit left,
//     the pool does not grow; Reclaim kills a pooled sandbox to make room
//     for a create and hands its unit to the caller.
//   - Pooled sandboxes are the backend's like any other: Cleanup after a
//     crash removes them, and Close kills them.
//   - A Create of the pool's kind that finds no sandbox ready waits for one
//     being started when it is expected sooner than the Create's own start
//     would take (never longer than a start takes lately); otherwise, and
//     for every Create the pool cannot serve, it goes straight to the
//     backend.
package warm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/quiet"
)

// Budget is the count of sandboxes the pool's sandboxes share with
// everything else (the daemon's --max-sandboxes).
type Budget interface {
	// TryAcquire takes one unit, reporting false when none is left.
	TryAcquire() bool
	// Release gives back one unit taken with TryAcquire.
	Release()
}

// Options configures a Pool.
type Options struct {
	// Backend makes the sandboxes. Required.
	Backend isolation.Backend
	// Size is how many started sandboxes to keep. Zero disables pooling.
	Size int
	// RefillEvery is how often the pool tries to grow back to Size when
	// the Budget refused it earlier; zero means one second.
	RefillEvery time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// Target is the one kind of sandbox a Pool keeps.
type Target struct {
	RootFS string
	Limits isolation.Limits
	// Agent is the agent's configuration while the sandbox waits in the
	// pool (a hand-out replaces it with the request's).
	Agent isolation.AgentConfig
	// Network is the fence pooled sandboxes are created with (their
	// Spec.Network): the owner's, which keeps them deny-all until the
	// create that takes one gives it its policy. Required.
	Network isolation.Network
	// Prepare, if set, runs once a pooled sandbox's agent answers and
	// before the sandbox counts as ready: a template's start command and
	// the wait for its ready command. A sandbox it fails for is killed,
	// and the pool waits longer after each failure in a row (up to
	// maxPrepareBackoff) before it starts another.
	Prepare func(context.Context, isolation.Sandbox) error
	// SameEnv restricts the pool to creates whose agent environment is
	// Agent's: its sandboxes run services started with that environment
	// before the hand-over, which a later one would not reach.
	SameEnv bool
}

// Prepare's time limit, and the longest wait after failed Prepares.
const (
	prepareTimeout    = 11 * time.Minute
	maxPrepareBackoff = 5 * time.Minute
)

// unlimited is the Budget of a pool started with none.
type unlimited struct{}

func (unlimited) TryAcquire() bool { return true }
func (unlimited) Release()         {}

// Pool is a pooling isolation.Backend.
type Pool struct {
	opts Options
	log  *slog.Logger

	mu sync.Mutex
	// +checklocks:mu
	target Target
	// +checklocks:mu
	budget Budget // nil until Start
	// +checklocks:mu
	ready []isolation.Sandbox
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	changed chan struct{} // closed and replaced when ready or fillStarts changes
	// +checklocks:mu
	failures int // Prepare failures in a row
	// +checklocks:mu
	notBefore time.Time // no sandbox is started before (after failures)
	// +checklocks:mu
	fillStarts []time.Time // one per sandbox being started: when it began (or begins)
	// +checklocks:mu
	fillTime time.Duration // how long starting one took lately (0: unknown yet)
	// +checklocks:mu
	quickFill time.Duration // how long starting one takes when it runs unhindered (see fill)

	takes quiet.Events // creates' takes of ready sandboxes

	wg   sync.WaitGroup
	stop chan struct{}
}

var _ isolation.Backend = (*Pool)(nil)

// New returns a Pool over opts.Backend. It keeps nothing until Start.
func New(opts Options) *Pool {
	if opts.RefillEvery <= 0 {
		opts.RefillEvery = time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Pool{opts: opts, log: log, stop: make(chan struct{}), changed: make(chan struct{})}
}

// Name implements isolation.Backend.
func (p *Pool) Name() string { return p.opts.Backend.Name() }

// Cleanup implements isolation.Backend.
func (p *Pool) Cleanup(ctx context.Context) ([]string, error) {
	return p.opts.Backend.Cleanup(ctx)
}

// Start makes the pool keep Size sandboxes of t, each holding a unit of
// budget (nil: no budget), and starts filling it. Only the first call has
// an effect.
func (p *Pool) Start(t Target, budget Budget) {
	if p.opts.Size <= 0 {
		return
	}
	if budget == nil {
		budget = unlimited{}
	}
	p.mu.Lock()
	if p.budget != nil || p.closed {
		p.mu.Unlock()
		return
	}
	p.target, p.budget = t, budget
	p.refillLocked(refillDelay)
	p.mu.Unlock()
	p.wg.Add(1)
	go p.refiller()
}

// Create implements isolation.Backend.
func (p *Pool) Create(ctx context.Context, spec isolation.Spec) (isolation.Sandbox, error) {
	for p.serves(spec) {
		sb := p.take(ctx)
		if sb == nil {
			sb = p.awaitFill(ctx)
		}
		if sb == nil {
			break
		}
		// A pooled sandbox was started in the background; it is the
		// request's now.
		if fg, ok := isolation.As[isolation.Foregrounder](sb); ok {
			if err := fg.Foreground(); err != nil {
				p.log.WarnContext(ctx, "discarding a pooled sandbox", "sandbox_id", sb.ID(), "err", err)
				sb.Kill(context.WithoutCancel(ctx))
				continue
			}
		}
		// A pooled sandbox was started on Target.Network, deny-all: its
		// owner, the creator, gives it the request's policy once it is
		// handed out, before anything of the request runs (the agent's
		// configuration below starts nothing).
		if err := isolation.ConfigureAgent(ctx, sb, spec.Agent); err != nil {
			// A pooled sandbox that does not take its configuration is
			// not handed out.
			p.log.WarnContext(ctx, "discarding a pooled sandbox", "sandbox_id", sb.ID(), "err", err)
			sb.Kill(context.WithoutCancel(ctx))
			continue
		}
		return sb, nil
	}
	return p.opts.Backend.Create(ctx, spec)
}

// serves reports whether spec is of the kind the pool keeps.
func (p *Pool) serves(spec isolation.Spec) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.budget != nil && spec.ID == "" && len(spec.Binds) == 0 && spec.Backend == "" &&
		spec.RootFS == p.target.RootFS && spec.Limits == p.target.Limits &&
		(!p.target.SameEnv || maps.Equal(spec.Agent.EnvVars, p.target.Agent.EnvVars))
}

// WaitReady blocks until the pool holds a started sandbox (benchmarks use
// it to time only the hand-out).
func (p *Pool) WaitReady(ctx context.Context) error {
	for {
		p.mu.Lock()
		ready, changed := len(p.ready) > 0, p.changed
		p.mu.Unlock()
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Ready returns how many sandboxes the pool holds ready to hand out.
func (p *Pool) Ready() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

// Held returns how many sandboxes the pool holds, ready or being started.
func (p *Pool) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready) + len(p.fillStarts)
}

// take hands out a ready sandbox, if any, releasing its unit of the
// budget, and schedules refills.
func (p *Pool) take(ctx context.Context) isolation.Sandbox {
	p.mu.Lock()
	sb, dead := p.popLocked()
	delay := refillDelay
	if sb != nil {
		p.budget.Release()
		if p.takes.Note() && len(p.ready) > 0 {
			delay = quietRefillDelay
		}
	}
	p.refillLocked(delay)
	p.mu.Unlock()
	p.discard(ctx, dead)
	return sb
}

// awaitFill waits for a sandbox the pool is starting when one is expected
// sooner than a create of the request's own would take. Starting one takes
// about fillTime (the recent average, start command and ready command
// included), so the earliest one being started is expected at its start
// plus fillTime; a create of the request's own, at full CPU weight, takes
// about quickFill (the quickest recent start). It waits only when the
// first comes sooner, and until the earlier of the two (with some slack
// for the first), and returns nil if none came by then. A burst of
// creates then takes the sandboxes already on their way instead of
// starting more beside them on the same CPUs, while a fill slowed by its
// low weight on a busy machine (several times a create's own time) is not
// waited for.
func (p *Pool) awaitFill(ctx context.Context) isolation.Sandbox {
	p.mu.Lock()
	if len(p.fillStarts) == 0 || p.fillTime <= 0 {
		p.mu.Unlock()
		return nil
	}
	now := time.Now()
	deadline, wait := fillWait(now, p.fillStarts[0], p.fillTime, p.quickFill)
	p.mu.Unlock()
	if !wait {
		return nil
	}
	timer := time.NewTimer(deadline.Sub(now))
	defer timer.Stop()
	for {
		p.mu.Lock()
		sb, dead := p.popLocked()
		if sb != nil {
			p.budget.Release()
			p.refillLocked(refillDelay)
		}
		starting, changed := len(p.fillStarts), p.changed
		p.mu.Unlock()
		p.discard(ctx, dead)
		if sb != nil {
			return sb
		}
		if starting == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// popLocked removes the first live ready sandbox, and returns it with the
// dead ones met on the way (their units released).
//
// +checklocks:p.mu
func (p *Pool) popLocked() (isolation.Sandbox, []isolation.Sandbox) {
	var dead []isolation.Sandbox
	for len(p.ready) > 0 {
		sb := p.ready[0]
		p.ready = p.ready[1:]
		p.signalLocked()
		select {
		case <-sb.Done(): // died while waiting
			dead = append(dead, sb)
			p.budget.Release()
			continue
		default:
		}
		return sb, dead
	}
	return nil, dead
}

// discard kills sandboxes that died in the pool, for their host resources.
func (p *Pool) discard(ctx context.Context, dead []isolation.Sandbox) {
	for _, sb := range dead {
		sb.Kill(context.WithoutCancel(ctx))
	}
}

// Reclaim kills one pooled sandbox (of this pool, else of a pool behind
// it) to make room for a create and hands its unit of the budget to the
// caller instead of releasing it. When no
// sandbox is ready but some are being started, it waits for one. It
// reports false when the pool holds nothing (or ctx ends first).
func (p *Pool) Reclaim(ctx context.Context) bool {
	for {
		p.mu.Lock()
		if p.budget == nil {
			p.mu.Unlock()
			return p.reclaimBehind(ctx)
		}
		sb, dead := p.popLocked()
		filling, changed := len(p.fillStarts), p.changed
		p.mu.Unlock()
		p.discard(ctx, dead)
		if sb != nil {
			sb.Kill(context.WithoutCancel(ctx))
			return true
		}
		if filling == 0 {
			return p.reclaimBehind(ctx)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// reclaimBehind reclaims from a pool behind this one (pools of other
// targets chained in front of one another).
func (p *Pool) reclaimBehind(ctx context.Context) bool {
	if r, ok := isolation.As[interface{ Reclaim(context.Context) bool }](p.opts.Backend); ok {
		return r.Reclaim(ctx)
	}
	return false
}

// signalLocked wakes the waiters on a change of ready or fillStarts.
//
// +checklocks:p.mu
func (p *Pool) signalLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// refillLocked starts sandboxes until the pool holds Size, as far as the
// budget allows, each delay from now.
//
// +checklocks:p.mu
func (p *Pool) refillLocked(delay time.Duration) {
	if p.closed || p.budget == nil || time.Now().Before(p.notBefore) {
		return
	}
	for len(p.ready)+len(p.fillStarts) < p.opts.Size && p.budget.TryAcquire() {
		start := time.Now().Add(delay)
		p.fillStarts = append(p.fillStarts, start)
		p.wg.Add(1)
		go p.fill(p.target, start)
	}
}

// refiller grows the pool back when the budget allows it again.
func (p *Pool) refiller() {
	defer p.wg.Done()
	t := time.NewTicker(p.opts.RefillEvery)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		p.mu.Lock()
		p.refillLocked(refillDelay)
		p.mu.Unlock()
	}
}

// fillWait is awaitFill's choice: whether a create at now waits for the
// fill started (or starting) at first, and until when.
func fillWait(now, first time.Time, fillTime, quickFill time.Duration) (deadline time.Time, wait bool) {
	own := now.Add(quickFill)
	if first.Add(fillTime).After(own) {
		return time.Time{}, false
	}
	deadline = first.Add(fillTime + fillTime/2)
	if deadline.After(own) {
		deadline = own
	}
	return deadline, deadline.After(now)
}

// refillDelay is how long a refill waits after a hand-out: starting a
// sandbox takes tens of milliseconds of CPU, which on a small machine would
// otherwise slow the very sandbox just handed out.
const refillDelay = 25 * time.Millisecond

// A take after a quiet spell (package quiet) is usually followed at once by
// the sandbox's first command, which may well outlast refillDelay (a login
// shell's start on a larger template takes 20 ms and more): its refill
// waits quietRefillDelay instead, as long as another sandbox is ready.
// Takes closer together refill after refillDelay.
const quietRefillDelay = 150 * time.Millisecond

// fill starts one sandbox of t, whose unit of the budget is already taken,
// at start (its entry in fillStarts).
func (p *Pool) fill(t Target, start time.Time) {
	defer p.wg.Done()
	select {
	case <-time.After(time.Until(start)):
	case <-p.stop:
		p.mu.Lock()
		p.dropFillStartLocked(start)
		p.budget.Release()
		p.signalLocked()
		p.mu.Unlock()
		return
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, prepareFailed, err := p.startOne(ctx, t)
	if err != nil {
		p.log.Warn("starting a pooled sandbox", "root", t.RootFS, "err", err)
	}
	p.mu.Lock()
	p.noteFillLocked(start, began, prepareFailed, err)
	keep := err == nil && !p.closed
	if keep {
		p.ready = append(p.ready, sb)
	}
	budget := p.budget
	p.signalLocked()
	p.mu.Unlock()
	if err == nil && !keep { // closed meanwhile
		sb.Kill(ctx)
	}
	if !keep {
		budget.Release()
	}
}

// startOne starts a sandbox for t, waits until it serves and runs t's
// Prepare on it; a sandbox that fails is killed, and prepareFailed
// reports that it was Prepare that failed.
func (p *Pool) startOne(ctx context.Context, t Target) (sb isolation.Sandbox, prepareFailed bool, err error) {
	sb, err = p.opts.Backend.Create(ctx, isolation.Spec{RootFS: t.RootFS, Limits: t.Limits, Agent: t.Agent, Background: true,
		Network: t.Network})
	if err == nil {
		// Ready means serving: a backend's Create returns once the agent
		// is started, not once it answers, and a sandbox handed out
		// before would make its first request wait for the agent's start.
		if err = waitServing(ctx, sb); err != nil {
			sb.Kill(context.WithoutCancel(ctx))
		}
	}
	if err == nil && t.Prepare != nil {
		if err = p.prepare(t, sb); err != nil {
			prepareFailed = true
			sb.Kill(context.WithoutCancel(ctx))
		}
	}
	return sb, prepareFailed, err
}

// prepare runs t's Prepare on sb, for prepareTimeout at most; it ends
// with the pool's Close too.
func (p *Pool) prepare(t Target, sb isolation.Sandbox) error {
	pctx, pcancel := context.WithTimeout(context.Background(), prepareTimeout)
	go func() {
		select {
		case <-p.stop:
			pcancel()
		case <-pctx.Done():
		}
	}()
	err := t.Prepare(pctx, sb)
	pcancel()
	return err
}

// noteFillLocked records how the fill that was to begin at start (and
// began at began) ended: a failed Prepare backs the next fills off, a
// success resets that and updates the fill times.
//
// +checklocks:p.mu
func (p *Pool) noteFillLocked(start, began time.Time, prepareFailed bool, err error) {
	if prepareFailed {
		p.failures++
		p.notBefore = time.Now().Add(min(time.Second<<min(p.failures, 20), maxPrepareBackoff))
	} else if err == nil {
		p.failures = 0
	}
	p.dropFillStartLocked(start)
	if err == nil {
		if d := time.Since(began); p.fillTime == 0 {
			p.fillTime, p.quickFill = d, d
		} else {
			p.fillTime = (3*p.fillTime + d) / 4
			// The quickest recent start: what a start takes when nothing
			// slows it, which is about what a create of a request's own
			// takes at full CPU weight (a fill runs at a sixteenth of
			// it, so under load it takes several times longer). It
			// follows slower starts only slowly.
			p.quickFill = min(d, (7*p.quickFill+d)/8)
		}
	}
}

// dropFillStartLocked removes start from fillStarts.
//
// +checklocks:p.mu
func (p *Pool) dropFillStartLocked(start time.Time) {
	if i := slices.Index(p.fillStarts, start); i >= 0 {
		p.fillStarts = slices.Delete(p.fillStarts, i, i+1)
	}
}

// Close kills every pooled sandbox and stops refilling. Sandboxes handed
// out stay the caller's.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	all := p.ready
	p.ready = nil
	budget := p.budget
	p.signalLocked()
	p.mu.Unlock()
	close(p.stop)
	var errs []error
	for _, sb := range all {
		errs = append(errs, sb.Kill(ctx))
		budget.Release()
	}
	p.wg.Wait()
	return errors.Join(errs...)
}

// waitServing returns once sb's agent answers GET /health.
func waitServing(ctx context.Context, sb isolation.Sandbox) error {
	if err := isolation.AgentRequest(ctx, sb, http.MethodGet, "/health", nil); err != nil {
		return fmt.Errorf("waiting for the pooled sandbox's agent: %w", err)
	}
	return nil
}

// Unwrap returns the backend behind the pool: its capabilities (a
// router's Has, an Adopter's Adopt) are the pool's, found with isolation.As.
func (p *Pool) Unwrap() isolation.Backend { return p.opts.Backend }
