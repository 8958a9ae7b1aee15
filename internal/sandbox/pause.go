package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
	"github.com/fencesandbox/fence/internal/sandbox/idle"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Pause and resume conflicts. Both wrap api.ErrConflict.
var (
	errNotRunning = fmt.Errorf("%w", api.ErrConflict)
	errNotPaused  = fmt.Errorf("%w", api.ErrConflict)
)

// Memory is what a pause does with a sandbox's memory, and what a resume
// may restore (E2B's memory field).
type Memory int

const (
	// WithMemory pauses a sandbox in place: its processes stop where they
	// are, with their memory. A resume with it resumes either kind of
	// pause.
	WithMemory Memory = iota
	// WithoutMemory is E2B's filesystem-only pause (memory false): the
	// sandbox's filesystem is checkpointed and its processes killed (its
	// memory freed); the resume boots it anew on the checkpoint, with the
	// same ID, token, environment, network and metadata. A resume with it
	// asks for such a boot: a sandbox paused with its memory is refused
	// with an error wrapping api.ErrInvalidArgument, never resumed with
	// its memory.
	WithoutMemory
)

// Pauses owns the pause and resume of live sandboxes, the state machine
// running ⇄ paused of each (its entry's life lock serialises them), both
// kinds of pause (in place, with the memory; filesystem-only, on a layer)
// and their records. It reaches the Manager's registry only through
// pauseCore. Its methods are safe for concurrent use.
type Pauses struct {
	backend    string           // the backend's name, for errors
	layers     isolation.Layers // nil: no filesystem-only pauses
	keeper     LayerKeeper
	fences     *fences.Set
	store      Store
	cold       *coldKeeper
	adm        *admission
	quota      tenancy.Admission // the teams' paused and running limits
	reaper     *reaper
	maxTimeout time.Duration
	idle       *idle.Tracker // marks resumes and connects as use
	events
	log  *slog.Logger
	now  func() time.Time
	core pauseCore
}

// pauseCore is what pauses need of the Manager's registry of live
// sandboxes.
type pauseCore interface {
	// lookup returns live sandbox id; unknown and killed ones give an
	// error wrapping api.ErrNotFound, any after Shutdown ErrClosed.
	lookup(id string) (*entry, error)
	// extend is Manager.Extend.
	extend(ctx context.Context, id string, d time.Duration) error
	// stillLive kills box, just set as e's, if e was killed meanwhile.
	stillLive(ctx context.Context, e *entry, box isolation.Sandbox) error
}

// pauseHost is the Manager as its Pauses reach it.
type pauseHost struct{ m *Manager }

var _ pauseCore = pauseHost{}

func (h pauseHost) lookup(id string) (*entry, error) { return h.m.lookup(id) }

func (h pauseHost) extend(ctx context.Context, id string, d time.Duration) error {
	return h.m.Extend(ctx, id, d)
}

func (h pauseHost) stillLive(ctx context.Context, e *entry, box isolation.Sandbox) error {
	return (&Live{h.m, e}).stillLive(ctx, box)
}

// newPauses returns m's Pauses.
func newPauses(m *Manager) *Pauses {
	return &Pauses{backend: m.backend.Name(), layers: m.layers, keeper: m.keeper, fences: m.fences,
		store: m.store, cold: m.cold, adm: m.adm, quota: m.quota, reaper: m.reaper, maxTimeout: m.maxTimeout,
		events: m.events, log: m.log, now: m.now, core: pauseHost{m}}
}

// Pauses returns the pause and resume of m's sandboxes.
func (m *Manager) Pauses() *Pauses { return m.pauses }

// Pause pauses a running sandbox, with its memory or without it (see
// Memory), until Resume or Connect. Traffic to it gets the proxy's 502
// meanwhile, and traffic in flight is cut. A paused sandbox gives an
// error wrapping api.ErrConflict; unknown and killed ones
// api.ErrNotFound; a backend that cannot pause (or, without memory, keeps
// no layers) api.ErrUnimplemented.
func (p *Pauses) Pause(ctx context.Context, id string, mem Memory) error {
	return p.pause(ctx, id, "request", mem)
}

func (p *Pauses) pause(ctx context.Context, id, reason string, mem Memory) error {
	if mem == WithoutMemory {
		return p.pauseCold(ctx, id, reason)
	}
	return p.pauseWarm(ctx, id, reason, nil)
}

// pauseIdle pauses a sandbox left idle, with its memory, unless quiet
// (called under its life lock) says it was used meanwhile. Its resume
// gives it back the time its deadline was ahead (resume).
func (p *Pauses) pauseIdle(ctx context.Context, id string, quiet func() bool) error {
	return p.pauseWarm(ctx, id, "idle", quiet)
}

// pauseWarm is the pause in place, with the memory. A pause with quiet
// (for idleness) is made only if quiet reports true under e.life.
func (p *Pauses) pauseWarm(ctx context.Context, id, reason string, quiet func() bool) error {
	e, err := ownedLookup(ctx, p.core, id)
	if err != nil {
		return err
	}
	bp, ok := isolation.As[isolation.Pauser](e.sb())
	if !ok {
		err := fmt.Errorf("pausing sandbox %s: the %s backend cannot pause sandboxes: %w", id, p.backend, api.ErrUnimplemented)
		if quiet != nil {
			err = fmt.Errorf("%w (%w)", err, idle.ErrCannotPause)
		}
		return err
	}
	e.life.Lock()
	defer e.life.Unlock()
	if quiet != nil && !quiet() {
		return fmt.Errorf("pausing sandbox %s: %w", id, idle.ErrNotQuiet)
	}
	started, reopen, err := p.stopRun(e, id, quiet != nil)
	if err != nil {
		return err
	}
	// Neither the pause nor its record may be abandoned half-way because
	// the client left.
	ctx = context.WithoutCancel(ctx)
	if err := bp.Pause(ctx); err != nil {
		reopen()
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	clock := p.now()
	now := clock.UTC()
	if err := p.cold.recordPause(ctx, e, "", store.StateRunning, started, now); err != nil {
		// Killed meanwhile, or the store failed: nothing is paused.
		rerr := bp.Resume(ctx)
		reopen()
		return fmt.Errorf("recording the pause of sandbox %s: %w", id, errors.Join(err, rerr))
	}
	e.mu.Lock()
	e.info.EndAt = now // E2B shows a paused sandbox's end as its pause time
	e.use.Mark(clock, true)
	e.mu.Unlock()
	p.record(ctx, audit.TypePause, id, map[string]any{"reason": reason})
	p.log.InfoContext(ctx, "sandbox paused", "sandbox_id", id, "reason", reason)
	return nil
}

// pauseCold is the filesystem-only pause: the filesystem is checkpointed,
// every process is killed (the memory is freed), and the resume boots the
// sandbox anew on the checkpoint.
func (p *Pauses) pauseCold(ctx context.Context, id, reason string) error {
	return p.pauseOnLayer(ctx, id, reason, p.keeper.CheckpointFiles)
}

// pauseOnLayer is a pause on a layer that checkpoint makes of the
// sandbox (its filesystem for pauseCold), every process killed, the
// resume booting the sandbox on the layer.
func (p *Pauses) pauseOnLayer(ctx context.Context, id, reason string,
	checkpoint func(context.Context, isolation.Sandbox) (isolation.LayerInfo, error)) error {
	if p.layers == nil {
		return NoLayers(p.backend)
	}
	e, err := ownedLookup(ctx, p.core, id)
	if err != nil {
		return err
	}
	e.life.Lock()
	defer e.life.Unlock()
	started, reopen, err := p.stopRun(e, id, false)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	defer p.keeper.Hold()()
	info, err := checkpoint(ctx, e.sb())
	if err != nil {
		reopen()
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	clock := p.now()
	now := clock.UTC()
	if err := p.cold.recordPause(ctx, e, info.ID, store.StateRunning, started, now); err != nil {
		_ = p.layers.DeleteLayer(ctx, info.ID)
		reopen()
		return fmt.Errorf("recording the pause of sandbox %s: %w", id, err)
	}
	old := e.sb()
	e.setBox(parkedBox{id})
	e.mu.Lock()
	e.cold = info.ID
	e.info.EndAt = now
	e.use.Mark(clock, true)
	e.mu.Unlock()
	killBox(ctx, p.log, old)
	p.record(ctx, audit.TypePause, id, map[string]any{"reason": reason, "memory": info.Memory})
	p.log.InfoContext(ctx, "sandbox paused without memory", "sandbox_id", id, "reason", reason)
	return nil
}

// stopRun moves a running sandbox to paused, for every kind of pause:
// from here Live shows it paused (the proxy refuses its traffic), what is in flight is cut, and its
// standby goes (nothing is rewound while paused). It returns when the run
// started and reopen, which moves the sandbox back to running should the
// pause fail; a sandbox that is not running gives an error wrapping
// errNotRunning. A pause for idleness (idled) is marked so at once, with
// what its deadline has left: traffic that finds it pausing waits for the
// pause and resumes it. The caller holds e.life.
func (p *Pauses) stopRun(e *entry, id string, idled bool) (started time.Time, reopen func(), err error) {
	e.mu.Lock()
	if e.info.State != StateRunning {
		e.mu.Unlock()
		return time.Time{}, nil, fmt.Errorf("sandbox '%s' is already paused: %w", id, errNotRunning)
	}
	requota, err := p.quota.Pause(id)
	if err != nil {
		e.mu.Unlock()
		return time.Time{}, nil, err // E2B's message, as it is
	}
	e.info.State = StatePaused
	// Kept with the pause's record (a resume after a restart reads it);
	// stale on a sandbox whose pause fails, which runs (no resume reads it).
	e.idlePaused, e.idleLeft = idled, e.info.EndAt.Sub(p.now())
	close(e.runDone)
	started = e.info.StartedAt
	e.mu.Unlock()
	p.keeper.Release(id)
	reopen = func() {
		requota()
		e.mu.Lock()
		e.info.State = StateRunning
		e.runDone = make(chan struct{})
		e.mu.Unlock()
		p.reaper.nudge() // its deadline is back
	}
	return started, reopen, nil
}

// Resume resumes a paused sandbox with the deadline now+d, as a new run
// (StartedAt is now); autoPause, if not nil, replaces its AutoPause. With
// WithoutMemory it asks for a cold boot (see Memory). A running sandbox
// gives an error wrapping api.ErrConflict; unknown and killed ones
// api.ErrNotFound.
func (p *Pauses) Resume(ctx context.Context, id string, d time.Duration, autoPause *bool, mem Memory) (*Sandbox, error) {
	if err := checkTimeout(d, p.maxTimeout); err != nil {
		return nil, err
	}
	e, err := ownedLookup(ctx, p.core, id)
	if err != nil {
		return nil, err
	}
	if err := p.resume(ctx, e, d, "request", mem == WithoutMemory); err != nil {
		return nil, err
	}
	p.idle.Touch(id)
	if autoPause != nil {
		if _, ok := isolation.As[isolation.Pauser](e.sb()); ok {
			e.mu.Lock()
			e.info.AutoPause = *autoPause
			e.mu.Unlock()
		}
	}
	return e.snapshot(), nil
}

// Connect is E2B's connect: a running sandbox's deadline moves to now+d
// unless it is already later (Manager.Extend), and a paused one is
// resumed with the deadline now+d (WithoutMemory asks for a cold boot of
// it, as Resume). It reports whether it resumed the sandbox.
func (p *Pauses) Connect(ctx context.Context, id string, d time.Duration, mem Memory) (*Sandbox, bool, error) {
	if err := checkTimeout(d, p.maxTimeout); err != nil {
		return nil, false, err
	}
	e, err := ownedLookup(ctx, p.core, id)
	if err != nil {
		return nil, false, err
	}
	p.idle.Touch(id)
	if e.state() == StatePaused {
		err := p.resume(ctx, e, d, "connect", mem == WithoutMemory)
		if err == nil {
			return e.snapshot(), true, nil
		}
		if !errors.Is(err, errNotPaused) {
			return nil, false, err
		}
		// Resumed by someone else meanwhile: it runs, so extend it.
	}
	if err := p.core.extend(ctx, id, d); err != nil {
		return nil, false, err
	}
	e, err = ownedLookup(ctx, p.core, id)
	if err != nil {
		return nil, false, err
	}
	return e.snapshot(), false, nil
}

// WakeOnTraffic resumes a paused sandbox created with AutoResume, with its
// create timeout, and one paused for idleness, with the time its deadline
// was ahead at the pause, for traffic that arrived for it. It reports
// whether the sandbox runs now.
func (p *Pauses) WakeOnTraffic(ctx context.Context, id string) bool {
	e, err := ownedLookup(ctx, p.core, id)
	if err != nil {
		return false
	}
	e.mu.Lock()
	st, auto := e.info.State, e.info.AutoResume || e.idlePaused
	e.mu.Unlock()
	if st == StateRunning {
		return true
	}
	if !auto {
		return false
	}
	err = p.resume(ctx, e, e.timeout, "traffic", false)
	if err != nil && !errors.Is(err, errNotPaused) {
		p.log.ErrorContext(ctx, "resuming sandbox on traffic", "sandbox_id", id, "err", err)
		return false
	}
	return true
}

// wakeIdle resumes e, as traffic does, if it is paused for idleness; the
// caller reads its state after.
func (p *Pauses) wakeIdle(ctx context.Context, e *entry) {
	e.mu.Lock()
	idled := e.idlePaused && e.info.State == StatePaused
	e.mu.Unlock()
	if !idled {
		return
	}
	if err := p.resume(ctx, e, e.timeout, "traffic", false); err != nil && !errors.Is(err, errNotPaused) {
		p.log.ErrorContext(ctx, "resuming an idle sandbox for a request", "sandbox_id", e.sb().ID(), "err", err)
	}
}

// resume resumes e. With coldOnly it refuses (before anything changes) a
// sandbox paused with its memory: the caller asked for a cold boot, which
// fence does not make of a memory pause.
func (p *Pauses) resume(ctx context.Context, e *entry, d time.Duration, reason string, coldOnly bool) error {
	id := e.sb().ID()
	e.life.Lock()
	defer e.life.Unlock()
	if e.state() != StatePaused {
		return fmt.Errorf("sandbox '%s' is already running: %w", id, errNotPaused)
	}
	cold := e.isCold()
	if coldOnly && !cold {
		return fmt.Errorf("sandbox '%s' was paused with its memory: a resume without it (a cold boot) is not enabled (sandbox_memory_override_disabled): %w", id, api.ErrInvalidArgument)
	}
	bp, ok := isolation.As[isolation.Pauser](e.sb())
	if !ok && !cold { // cannot happen: it was paused through it
		return fmt.Errorf("resuming sandbox %s: %w", id, api.ErrUnimplemented)
	}
	// A filesystem-only pause freed its processes: its resume boots them
	// again and needs the headroom of a create (a memory pause kept them).
	if cold {
		if err := p.adm.admitBoot(); err != nil {
			return fmt.Errorf("resuming sandbox %s: %w", id, err)
		}
	}
	if err := p.quota.CheckTimeout(id, d); err != nil {
		return err
	}
	repause, err := p.quota.Resume(id)
	if err != nil {
		return err // E2B's message, as it is
	}
	ctx = context.WithoutCancel(ctx)
	clock := p.now()
	now := clock.UTC()
	end := now.Add(d)
	e.mu.Lock()
	idled, left := e.idlePaused, e.idleLeft
	e.mu.Unlock()
	if idled {
		// Paused for idleness: the time paused does not count. Traffic
		// gets the deadline back as it was ahead; a connect or resume
		// never ends up with less (as a connect to a running sandbox).
		if keep := now.Add(left); reason == "traffic" || keep.After(end) {
			end = keep
		}
	}
	// The record first: a sandbox killed meanwhile has none to resume.
	if err := p.store.Transition(ctx, id, store.StatePaused, store.StateRunning, now, end); err != nil {
		repause()
		if errors.Is(err, api.ErrNotFound) {
			return notFound(id)
		}
		return fmt.Errorf("recording the resume of sandbox %s: %w", id, err)
	}
	resume := func() error {
		if cold {
			return p.resumeCold(ctx, e) // +checklocksignore: a closure made under e.life, released by Resume
		}
		return bp.Resume(ctx) // +checklocksignore: a closure made under e.life, released by Resume
	}
	if err := resume(); err != nil {
		repause()
		e.mu.Lock()
		paused := e.info.EndAt
		e.mu.Unlock()
		// Paused again as it was (on the same layer, if without memory),
		// with what its resume needs.
		if terr := p.cold.recordPause(ctx, e, e.coldLayer(), store.StateRunning, e.snapshot().StartedAt, paused); terr != nil {
			p.log.ErrorContext(ctx, "restoring the record of a sandbox that failed to resume", "sandbox_id", id, "err", terr)
		}
		return fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	e.mu.Lock()
	e.info.State = StateRunning
	e.info.StartedAt = now
	e.info.EndAt = end
	e.idlePaused = false
	e.use.Mark(clock, false)
	e.runDone = make(chan struct{})
	e.mu.Unlock()
	p.reaper.nudgeAt(end)
	p.record(ctx, audit.TypeResume, id, map[string]any{"reason": reason, "end_at": end})
	p.log.InfoContext(ctx, "sandbox resumed", "sandbox_id", id, "reason", reason, "end_at", end)
	return nil
}

// resumeCold boots a sandbox paused without memory on its pause's layer.
// The caller holds e.life and has recorded the resume.
func (p *Pauses) resumeCold(ctx context.Context, e *entry) error {
	e.mu.Lock()
	layer := e.cold
	e.mu.Unlock()
	defer p.keeper.Hold()()
	spec := e.spec
	spec.ID = e.sb().ID()
	e.mu.Lock()
	nc := e.net
	e.mu.Unlock()
	box, err := bootOn(ctx, p.fences, p.layers, spec, nc, layer)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.cold, e.layer, e.coldKept = "", layer, false
	e.mu.Unlock()
	e.setBox(box)
	p.keeper.Collect()
	return p.core.stillLive(ctx, e, box)
}
