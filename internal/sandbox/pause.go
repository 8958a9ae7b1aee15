package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/store"
)

// Pause and resume conflicts. Both wrap api.ErrConflict.
var (
	errNotRunning = fmt.Errorf("%w", api.ErrConflict)
	errNotPaused  = fmt.Errorf("%w", api.ErrConflict)
)

// Pause pauses a running sandbox in place: its processes stop where they
// are, with their memory, until Resume or Connect. Traffic to it gets the
// proxy's 502 meanwhile, and traffic in flight is cut. A paused sandbox
// gives an error wrapping api.ErrConflict; unknown and killed ones
// api.ErrNotFound; a backend that cannot pause api.ErrUnimplemented.
func (m *Manager) Pause(ctx context.Context, id string) error {
	return m.pause(ctx, id, "request")
}

// PauseWithoutMemory is E2B's filesystem-only pause (memory false): the
// sandbox's filesystem is checkpointed and its processes killed (its
// memory freed); the resume boots it anew on the checkpoint, with the
// same ID, token, environment, network and metadata. Errors as Pause.
func (m *Manager) PauseWithoutMemory(ctx context.Context, id string) error {
	return m.pauseCold(ctx, id, "request")
}

func (m *Manager) pause(ctx context.Context, id, reason string) error {
	e, err := m.lookup(id)
	if err != nil {
		return err
	}
	p, ok := isolation.As[isolation.Pauser](e.sb())
	if !ok {
		return fmt.Errorf("pausing sandbox %s: the %s backend cannot pause sandboxes: %w", id, m.backend.Name(), api.ErrUnimplemented)
	}
	e.life.Lock()
	defer e.life.Unlock()
	started, reopen, err := m.stopRun(e, id)
	if err != nil {
		return err
	}
	// Neither the pause nor its record may be abandoned half-way because
	// the client left.
	ctx = context.WithoutCancel(ctx)
	if err := p.Pause(ctx); err != nil {
		reopen()
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	clock := m.now()
	now := clock.UTC()
	if err := m.cold.recordPause(ctx, e, "", store.StateRunning, started, now); err != nil {
		// Killed meanwhile, or the store failed: nothing is paused.
		rerr := p.Resume(ctx)
		reopen()
		return fmt.Errorf("recording the pause of sandbox %s: %w", id, errors.Join(err, rerr))
	}
	e.mu.Lock()
	e.info.EndAt = now // E2B shows a paused sandbox's end as its pause time
	e.use.Mark(clock, true)
	e.mu.Unlock()
	m.record(ctx, audit.TypePause, id, map[string]any{"reason": reason})
	m.log.InfoContext(ctx, "sandbox paused", "sandbox_id", id, "reason", reason)
	return nil
}

// stopRun moves a running sandbox to paused, for every kind of pause:
// from here Lookup refuses its traffic, what is in flight is cut, and its
// standby goes (nothing is rewound while paused). It returns when the run
// started and reopen, which moves the sandbox back to running should the
// pause fail; a sandbox that is not running gives an error wrapping
// errNotRunning. The caller holds e.life.
func (m *Manager) stopRun(e *entry, id string) (started time.Time, reopen func(), err error) {
	e.mu.Lock()
	if e.info.State != StateRunning {
		e.mu.Unlock()
		return time.Time{}, nil, fmt.Errorf("sandbox '%s' is already paused: %w", id, errNotRunning)
	}
	e.info.State = StatePaused
	close(e.runDone)
	started = e.info.StartedAt
	e.mu.Unlock()
	m.keeper.Release(id)
	reopen = func() {
		e.mu.Lock()
		e.info.State = StateRunning
		e.runDone = make(chan struct{})
		e.mu.Unlock()
		m.reaper.nudge() // its deadline is back
	}
	return started, reopen, nil
}

// Resume resumes a paused sandbox with the deadline now+d, as a new run
// (StartedAt is now); autoPause, if not nil, replaces its AutoPause. A
// running sandbox gives an error wrapping api.ErrConflict; unknown and
// killed ones api.ErrNotFound.
func (m *Manager) Resume(ctx context.Context, id string, d time.Duration, autoPause *bool) (*Sandbox, error) {
	return m.resumeRequest(ctx, id, d, autoPause, false)
}

// ResumeWithoutMemory is Resume asking for a cold boot (E2B's memory
// false): a sandbox paused without its memory is resumed as always (it
// boots anew); one paused with its memory is refused with an error
// wrapping api.ErrInvalidArgument, never resumed with its memory.
func (m *Manager) ResumeWithoutMemory(ctx context.Context, id string, d time.Duration, autoPause *bool) (*Sandbox, error) {
	return m.resumeRequest(ctx, id, d, autoPause, true)
}

func (m *Manager) resumeRequest(ctx context.Context, id string, d time.Duration, autoPause *bool, cold bool) (*Sandbox, error) {
	if err := checkTimeout(d, m.maxTimeout); err != nil {
		return nil, err
	}
	e, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	if err := m.resume(ctx, e, d, "request", cold); err != nil {
		return nil, err
	}
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
// unless it is already later (Extend), and a paused one is resumed with
// the deadline now+d. It reports whether it resumed the sandbox.
func (m *Manager) Connect(ctx context.Context, id string, d time.Duration) (*Sandbox, bool, error) {
	return m.connect(ctx, id, d, false)
}

// ConnectWithoutMemory is Connect asking for a cold boot of a paused
// sandbox, as ResumeWithoutMemory; a running sandbox is extended as by
// Connect.
func (m *Manager) ConnectWithoutMemory(ctx context.Context, id string, d time.Duration) (*Sandbox, bool, error) {
	return m.connect(ctx, id, d, true)
}

func (m *Manager) connect(ctx context.Context, id string, d time.Duration, cold bool) (*Sandbox, bool, error) {
	if err := checkTimeout(d, m.maxTimeout); err != nil {
		return nil, false, err
	}
	e, err := m.lookup(id)
	if err != nil {
		return nil, false, err
	}
	if e.state() == StatePaused {
		err := m.resume(ctx, e, d, "connect", cold)
		if err == nil {
			return e.snapshot(), true, nil
		}
		if !errors.Is(err, errNotPaused) {
			return nil, false, err
		}
		// Resumed by someone else meanwhile: it runs, so extend it.
	}
	if err := m.Extend(ctx, id, d); err != nil {
		return nil, false, err
	}
	s, err := m.Get(ctx, id)
	return s, false, err
}

// WakeOnTraffic resumes a paused sandbox created with AutoResume, with its
// create timeout, for traffic that arrived for it. It reports whether the
// sandbox runs now.
func (m *Manager) WakeOnTraffic(ctx context.Context, id string) bool {
	e, err := m.lookup(id)
	if err != nil {
		return false
	}
	e.mu.Lock()
	st, auto := e.info.State, e.info.AutoResume
	e.mu.Unlock()
	if st == StateRunning {
		return true
	}
	if !auto {
		return false
	}
	err = m.resume(ctx, e, e.timeout, "traffic", false)
	if err != nil && !errors.Is(err, errNotPaused) {
		m.log.ErrorContext(ctx, "resuming sandbox on traffic", "sandbox_id", id, "err", err)
		return false
	}
	return true
}

// resume resumes e. With coldOnly it refuses (before anything changes) a
// sandbox paused with its memory: the caller asked for a cold boot, which
// fence does not make of a memory pause.
func (m *Manager) resume(ctx context.Context, e *entry, d time.Duration, reason string, coldOnly bool) error {
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
	p, ok := isolation.As[isolation.Pauser](e.sb())
	if !ok && !cold { // cannot happen: it was paused through it
		return fmt.Errorf("resuming sandbox %s: %w", id, api.ErrUnimplemented)
	}
	// A filesystem-only pause freed its processes: its resume boots them
	// again and needs the headroom of a create (a memory pause kept them).
	if cold {
		if err := m.adm.admitBoot(); err != nil {
			return fmt.Errorf("resuming sandbox %s: %w", id, err)
		}
	}
	ctx = context.WithoutCancel(ctx)
	clock := m.now()
	now := clock.UTC()
	end := now.Add(d)
	// The record first: a sandbox killed meanwhile has none to resume.
	if err := m.store.Transition(ctx, id, store.StatePaused, store.StateRunning, now, end); err != nil {
		if errors.Is(err, api.ErrNotFound) {
			return notFound(id)
		}
		return fmt.Errorf("recording the resume of sandbox %s: %w", id, err)
	}
	resume := func() error {
		if cold {
			return m.resumeCold(ctx, e) // +checklocksignore: a closure made under e.life, released by Resume
		}
		return p.Resume(ctx) // +checklocksignore: a closure made under e.life, released by Resume
	}
	if err := resume(); err != nil {
		e.mu.Lock()
		paused := e.info.EndAt
		e.mu.Unlock()
		// Paused again as it was (on the same layer, if without memory),
		// with what its resume needs.
		if terr := m.cold.recordPause(ctx, e, e.coldLayer(), store.StateRunning, e.snapshot().StartedAt, paused); terr != nil {
			m.log.ErrorContext(ctx, "restoring the record of a sandbox that failed to resume", "sandbox_id", id, "err", terr)
		}
		return fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	e.mu.Lock()
	e.info.State = StateRunning
	e.info.StartedAt = now
	e.info.EndAt = end
	e.use.Mark(clock, false)
	e.runDone = make(chan struct{})
	e.mu.Unlock()
	m.reaper.nudgeAt(end)
	m.record(ctx, audit.TypeResume, id, map[string]any{"reason": reason, "end_at": end})
	m.log.InfoContext(ctx, "sandbox resumed", "sandbox_id", id, "reason", reason, "end_at", end)
	return nil
}
