package sandbox

import (
	"context"

	"github.com/fencesandbox/fence/internal/sandbox/usage"
)

// The Manager feeds each entry's usage.Acc (create, readings, pause,
// resume, kill) and answers, through liveUsage, the usage.Meter's
// questions about live sandboxes; the Meter owns the rest of usage
// accounting.
var _ usage.Live = liveUsage{}

// liveUsage is the Manager as its usage.Meter reads it.
type liveUsage struct{ m *Manager }

// Meter returns the Manager's usage accounting.
func (m *Manager) Meter() *usage.Meter { return m.usage }

// AddLiveEgress adds the bytes of one ended flow to live sandbox id's
// usage and returns its actor; false when it is not live.
func (l liveUsage) AddLiveEgress(id string, out, in int64) (string, bool) {
	m := l.m
	m.mu.Lock()
	e := m.running[id]
	m.mu.Unlock()
	if e == nil {
		return "", false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.use.AddEgress(out, in)
	return e.use.Actor(), true
}

// LiveUsage returns the usage of the live sandboxes, or of sandbox id
// alone (read afresh) when id is not "".
func (l liveUsage) LiveUsage(id string) []usage.Usage {
	m := l.m
	clock := m.now()
	m.mu.Lock()
	live := make([]*entry, 0, len(m.running))
	for eid, e := range m.running {
		if id == "" || id == eid {
			live = append(live, e)
		}
	}
	m.mu.Unlock()
	out := make([]usage.Usage, 0, len(live))
	for _, e := range live {
		if id != "" {
			e.sample(clock) // one sandbox asked for: its figures as of now
		}
		e.mu.Lock()
		u := e.use.Snapshot(clock)
		u.SandboxID, u.Template, u.State = e.info.ID, e.info.TemplateID, string(e.info.State)
		e.mu.Unlock()
		out = append(out, u)
	}
	return out
}

// finishUsage takes a last reading of a sandbox being killed (its cgroup
// still there) and records its usage.
func (m *Manager) finishUsage(ctx context.Context, e *entry) {
	clock := m.now()
	e.sample(clock)
	now := clock.UTC()
	e.mu.Lock()
	u := e.use.Snapshot(clock)
	u.SandboxID, u.Template, u.State = e.info.ID, e.info.TemplateID, "killed"
	e.mu.Unlock()
	u.EndedAt = &now
	m.usage.Finish(ctx, u)
}
