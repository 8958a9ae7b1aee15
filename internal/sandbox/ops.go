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
	"github.com/fencesandbox/fence/internal/tenancy"
)

func notFound(id string) error {
	return fmt.Errorf("sandbox %q not found: %w", id, api.ErrNotFound)
}

func (m *Manager) lookup(id string) (*entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	e, ok := m.running[id]
	if !ok {
		return nil, notFound(id)
	}
	return e, nil
}

// Get returns a running sandbox. Unknown and killed IDs give an error
// wrapping api.ErrNotFound.
func (m *Manager) Get(ctx context.Context, id string) (*Sandbox, error) {
	e, err := m.owned(ctx, id)
	if err != nil {
		return nil, err
	}
	return e.snapshot(), nil
}

// Live returns a copy of live (running or paused) sandbox id and its
// current backend sandbox, read together: for the traffic proxy, which
// serves running ones alone (the copy's RunDone is closed when the run it
// read ends by a pause, and its Incarnation names that backend sandbox),
// and for an export. Unknown and killed IDs give an error wrapping
// api.ErrNotFound.
func (m *Manager) Live(id string) (*Sandbox, isolation.Sandbox, error) {
	e, err := m.lookup(id)
	if err != nil {
		return nil, nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.info.clone()
	s.RunDone = e.runDone
	ref := e.boxp.Load()
	s.Incarnation = ref.inc
	return s, ref.Sandbox, nil
}

// MatchToken returns the first live sandbox (running or paused: traffic
// for a paused one then gets the proxy's answer for it, the 502 or an
// auto-resume) whose envd access token match accepts. It reads memory only (no store) and calls match outside
// the manager's lock, once per running sandbox with a token at most.
func (m *Manager) MatchToken(match func(token string) bool) (string, bool) {
	type idToken struct{ id, token string }
	m.mu.Lock()
	all := make([]idToken, 0, len(m.running))
	for id, e := range m.running {
		e.mu.Lock()
		if tok := e.info.EnvdAccessToken; tok != "" {
			all = append(all, idToken{id, tok})
		}
		e.mu.Unlock()
	}
	m.mu.Unlock()
	for _, it := range all {
		if match(it.token) {
			return it.id, true
		}
	}
	return "", false
}

// List returns the running and paused sandboxes matching f, newest first
// (by the start of their current run).
func (m *Manager) List(ctx context.Context, f ListFilter) ([]*Sandbox, error) {
	if err := func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.closed {
			return ErrClosed
		}
		return nil
	}(); err != nil {
		return nil, err
	}
	states := []store.State{store.StateRunning, store.StatePaused}
	if len(f.States) > 0 {
		states = nil
	}
	for _, s := range f.States {
		switch s {
		case StateRunning:
			states = append(states, store.StateRunning)
		case StatePaused:
			states = append(states, store.StatePaused)
		default:
			return nil, invalid("unknown state %q: want running or paused", s)
		}
	}
	if f.Limit < 0 {
		return nil, invalid("limit %d is negative", f.Limit)
	}
	sf := store.Filter{States: states, Template: f.Template, Metadata: f.Metadata, WithoutMetadataKeys: f.WithoutMetadataKeys, Limit: f.Limit,
		StartedAfter: f.StartedAfter, Ascending: f.Ascending}
	if f.PageToken != "" {
		t, id, err := api.ParsePageToken(f.PageToken)
		if err != nil {
			return nil, err
		}
		sf.Before = &store.Cursor{CreatedAt: t, ID: id}
	}
	recs, err := m.store.List(ctx, sf)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	out := make([]*Sandbox, 0, len(recs))
	for _, r := range recs {
		st := StateRunning
		if r.State == store.StatePaused {
			st = StatePaused
		}
		out = append(out, &Sandbox{
			ID: r.ID, TemplateID: r.Template, Alias: r.Alias, State: st,
			StartedAt: r.CreatedAt, EndAt: r.EndAt, Metadata: r.Metadata,
			CPUs: r.CPUs, MemoryMB: r.MemoryMB, DiskMB: r.DiskMB,
			EnvdAccessToken: r.EnvdAccessToken, AllowInternetAccess: r.AllowInternetAccess,
			Network: r.Network, Team: r.Team,
		})
	}
	return out, nil
}

// SetTimeout sets the deadline of a running sandbox to now+d. It may
// shorten or extend it.
func (m *Manager) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	return m.setEnd(ctx, id, d, false)
}

// Extend moves the deadline of a running sandbox to now+d unless it is
// already later: it never shortens (E2B's connect and refresh semantics).
func (m *Manager) Extend(ctx context.Context, id string, d time.Duration) error {
	return m.setEnd(ctx, id, d, true)
}

func (m *Manager) setEnd(ctx context.Context, id string, d time.Duration, onlyExtend bool) error {
	if err := checkTimeout(d, m.maxTimeout); err != nil {
		return err
	}
	e, err := m.owned(ctx, id)
	if err != nil {
		return err
	}
	m.idle.Touch(id)
	// The team's limit is checked once the sandbox is known to be the
	// caller's: another team's answers as a missing one.
	if err := m.quota.CheckTimeout(id, d); err != nil {
		return err
	}
	m.pauses.wakeIdle(ctx, e) // an idle pause is not the caller's: the request is served
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.info.State != StateRunning {
		return fmt.Errorf("sandbox %q is paused: resume it with connect first: %w", id, api.ErrNotFound)
	}
	end := m.now().UTC().Add(d)
	if onlyExtend && !end.After(e.info.EndAt) {
		return nil
	}
	if err := m.store.UpdateEndAt(ctx, id, end); err != nil {
		if errors.Is(err, api.ErrNotFound) {
			return notFound(id)
		}
		return fmt.Errorf("setting timeout of sandbox %s: %w", id, err)
	}
	e.info.EndAt = end
	m.reaper.nudgeAt(end)
	return nil
}

// Kill kills a running sandbox. Unknown and already killed IDs give an
// error wrapping api.ErrNotFound.
func (m *Manager) Kill(ctx context.Context, id string) error {
	return m.kill(ctx, id, "request")
}

func (m *Manager) kill(ctx context.Context, id, reason string) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	e, ok := m.running[id]
	ok = ok && tenancy.Visible(ctx, e.team)
	if ok {
		delete(m.running, id)
		delete(m.idleable, id)
		m.fences.Drop(id)
		m.adm.remove()
		m.quota.Remove(id)
	}
	m.mu.Unlock()
	if !ok {
		return notFound(id)
	}
	// The store's update runs beside the usage's last reading and the
	// backend's kill (neither needs the other), and the kill answers once
	// all are done. A daemon that stops between the two leaves nothing
	// alive under the killed record: the next Start's Backend.Cleanup
	// removes what it left, as it does for records left running.
	stored := make(chan struct{})
	go func() {
		defer close(stored)
		markKilled(ctx, m.store, m.log, id)
	}()
	e.finishUsage(ctx, m.usage, m.now())
	m.killRemoved(ctx, e.sb())
	m.keeper.Release(id)
	<-stored
	if e.usesLayers() {
		m.keeper.Collect()
	}
	m.record(ctx, audit.TypeKill, id, map[string]any{"reason": reason})
	m.log.InfoContext(ctx, "sandbox killed", "sandbox_id", id, "reason", reason)
	return nil
}

// Defaults are the resources and timeout of a sandbox whose request
// names none, the built-in values in place of zero Options.Defaults.
func (m *Manager) Defaults() Defaults { return m.defaults }

// Counts returns the numbers of running and of paused sandboxes.
func (m *Manager) Counts() (running, paused int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.running {
		switch e.state() {
		case StateRunning:
			running++
		case StatePaused:
			paused++
		}
	}
	return running, paused
}
