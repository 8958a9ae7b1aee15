package sandbox

import (
	"context"
	"time"

	"github.com/fencesandbox/fence/internal/sandbox/usage"
)

// Usage accounting and resource readings are the usage.Meter's: the
// Manager feeds each entry's usage.Acc and usage.Ring (create, readings,
// pause, resume, kill) and answers, through liveUsage, the Meter's
// questions about live sandboxes; the Meter owns the rest, the sampling
// loop (which Start runs) and the metrics over a time range included.
var _ usage.Live = liveUsage{}

// liveUsage is the Manager as its usage.Meter reads it.
type liveUsage struct{ m *Manager }

// Meter returns the Manager's usage accounting and resource readings.
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
			ctx, cancel := context.WithTimeout(context.Background(), usage.ReadTimeout)
			e.Read(ctx, clock) // one sandbox asked for: its figures as of now
			cancel()
		}
		e.mu.Lock()
		u := e.use.Snapshot(clock)
		u.SandboxID, u.Template, u.State = e.info.ID, e.info.TemplateID, string(e.info.State)
		e.mu.Unlock()
		out = append(out, u)
	}
	return out
}

// Readers returns the live sandboxes' entries.
func (l liveUsage) Readers() []usage.Reader {
	m := l.m
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]usage.Reader, 0, len(m.running))
	for _, e := range m.running {
		out = append(out, e)
	}
	return out
}

// Reader returns live sandbox id's entry.
func (l liveUsage) Reader(id string) (usage.Reader, error) {
	e, err := l.m.lookup(id)
	if err != nil {
		return nil, err
	}
	return e, nil
}

var _ usage.Reader = (*entry)(nil)

// Read records one reading of e's resource use at now, within ctx.
func (e *entry) Read(ctx context.Context, now time.Time) (usage.Sample, error) {
	st, err := e.sb().Stats(ctx)
	if err != nil {
		return usage.Sample{}, err
	}
	s := usage.Sample{At: now.UTC(), Stats: st}
	e.mu.Lock()
	defer e.mu.Unlock()
	s.EgressOut, s.EgressIn = e.use.Egress()
	e.samples.Add(s)
	e.use.Add(now, st.CPUUsage, st.MemoryBytes)
	return s, nil
}

// Each calls f with e's readings, oldest first.
func (e *entry) Each(f func(usage.Sample)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.samples.Each(f)
}

// finishUsage takes a last reading of e, being killed (its cgroup still
// there), at clock and records its usage with meter.
func (e *entry) finishUsage(ctx context.Context, meter *usage.Meter, clock time.Time) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), usage.ReadTimeout)
	e.Read(rctx, clock)
	cancel()
	now := clock.UTC()
	e.mu.Lock()
	u := e.use.Snapshot(clock)
	u.SandboxID, u.Template, u.State = e.info.ID, e.info.TemplateID, "killed"
	e.mu.Unlock()
	u.EndedAt = &now
	meter.Finish(ctx, u)
}
