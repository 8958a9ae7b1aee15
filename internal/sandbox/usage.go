package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/fencesandbox/fence/internal/audit"
)

// TypeUsage is the audit record of a killed sandbox's usage (Usage's
// fields), written when it is killed.
const TypeUsage = "sandbox.usage"

// idleFraction is the CPU use, in cores, under which an interval between
// two readings counts as idle.
const idleFraction = 0.01

const gib = float64(1 << 30)

// Usage is what one sandbox used over its life. CPU comes from its
// cgroup's counter; memory is integrated over the readings (every
// SampleEvery and one at kill), so GiB-seconds are exact to the sampling
// interval; idle is the running time in intervals with under 1% of a core
// used; egress counts the bytes of its flows that have ended.
type Usage struct {
	SandboxID        string     `json:"sandbox_id"`
	Actor            string     `json:"actor"` // who created it: "key:<hash>" or "daemon"
	Template         string     `json:"template,omitempty"`
	State            string     `json:"state"` // running, paused or killed
	CreatedAt        time.Time  `json:"created_at"`
	EndedAt          *time.Time `json:"ended_at,omitempty"`
	CPUSeconds       float64    `json:"cpu_seconds"`
	MemoryGiBSeconds float64    `json:"memory_gib_seconds"`
	IdleSeconds      float64    `json:"idle_seconds"`
	RunningSeconds   float64    `json:"running_seconds"`
	PausedSeconds    float64    `json:"paused_seconds"`
	EgressBytesOut   int64      `json:"egress_bytes_out"`
	EgressBytesIn    int64      `json:"egress_bytes_in"`
}

// KeyUsage is the sum of the usage of one actor's sandboxes.
type KeyUsage struct {
	Actor            string  `json:"actor"`
	Sandboxes        int     `json:"sandboxes"`
	CPUSeconds       float64 `json:"cpu_seconds"`
	MemoryGiBSeconds float64 `json:"memory_gib_seconds"`
	IdleSeconds      float64 `json:"idle_seconds"`
	RunningSeconds   float64 `json:"running_seconds"`
	PausedSeconds    float64 `json:"paused_seconds"`
	EgressBytesOut   int64   `json:"egress_bytes_out"`
	EgressBytesIn    int64   `json:"egress_bytes_in"`
}

// UsageReport is the answer of GET /usage.
type UsageReport struct {
	Sandboxes []Usage    `json:"sandboxes"`
	Keys      []KeyUsage `json:"keys"`
}

// UsageFilter selects sandboxes: one by ID, and those alive at some time
// in [Since, Until] (zero: open).
type UsageFilter struct {
	Sandbox      string
	Since, Until time.Time
}

// usageAcc accumulates a live sandbox's usage; guarded by its entry's mu.
// Its times are the daemon clock's own readings, monotonic reading kept
// (not .UTC(), which drops it): durations are measured on the monotonic
// clock, so a step of the wall clock (NTP, a resumed VM) during a
// sandbox's life is not charged to it.
type usageAcc struct {
	actor      string
	created    time.Time
	have       bool // a reading was taken
	lastAt     time.Time
	lastCPU    time.Duration
	lastMem    int64
	cpu        time.Duration
	memGiBs    float64
	idle       time.Duration
	stateSince time.Time
	paused     bool
	running    time.Duration
	pausedFor  time.Duration
	out, in    int64
}

// newUsage starts the usage of a sandbox created (or taken over) at now,
// running or paused.
func newUsage(actor string, now time.Time, paused bool) usageAcc {
	return usageAcc{actor: actor, created: now, stateSince: now, paused: paused}
}

// mark records a change between running and paused at now.
func (u *usageAcc) mark(now time.Time, paused bool) {
	u.wall(now)
	u.paused = paused
}

func (u *usageAcc) wall(now time.Time) {
	if d := now.Sub(u.stateSince); d > 0 {
		if u.paused {
			u.pausedFor += d
		} else {
			u.running += d
		}
		u.stateSince = now
	}
}

// add takes a reading; it returns the CPU and GiB-seconds it added, for
// the per-key counters.
func (u *usageAcc) add(at time.Time, cpu time.Duration, mem int64) (time.Duration, float64) {
	if u.created.IsZero() {
		u.created, u.stateSince = at, at
	}
	prevAt, prevMem := u.lastAt, u.lastMem
	if !u.have {
		// The time before the first reading is charged at that reading.
		prevAt, prevMem = u.created, mem
	}
	dcpu := cpu - u.lastCPU
	if dcpu < 0 {
		dcpu = 0
	}
	dt := at.Sub(prevAt)
	if dt < 0 {
		dt = 0
	}
	dmem := float64(prevMem+mem) / 2 / gib * dt.Seconds()
	if u.have && !u.paused && dt > 0 && dcpu.Seconds() < idleFraction*dt.Seconds() {
		u.idle += dt
	}
	u.cpu += dcpu
	u.memGiBs += dmem
	u.have, u.lastAt, u.lastCPU, u.lastMem = true, at, cpu, mem
	return dcpu, dmem
}

func (u *usageAcc) snapshot(now time.Time) Usage {
	c := *u
	c.wall(now)
	return Usage{
		Actor: c.actor, CreatedAt: c.created.UTC(), CPUSeconds: c.cpu.Seconds(), MemoryGiBSeconds: c.memGiBs,
		IdleSeconds: c.idle.Seconds(), RunningSeconds: c.running.Seconds(), PausedSeconds: c.pausedFor.Seconds(),
		EgressBytesOut: c.out, EgressBytesIn: c.in,
	}
}

// keyTotals are the per-actor counters served in /metrics; they cover
// this daemon's run.
type keyTotals struct {
	mu sync.Mutex
	// +checklocks:mu
	m map[string]*KeyUsage
}

func (k *keyTotals) add(actor string, cpu time.Duration, memGiBs float64, out, in int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]*KeyUsage{}
	}
	t := k.m[actor]
	if t == nil {
		t = &KeyUsage{Actor: actor}
		k.m[actor] = t
	}
	t.CPUSeconds += cpu.Seconds()
	t.MemoryGiBSeconds += memGiBs
	t.EgressBytesOut += out
	t.EgressBytesIn += in
}

// UsageCounters returns the per-key totals since this daemon started
// (CPU-seconds, GiB-seconds and egress bytes), for /metrics.
func (m *Manager) UsageCounters() []KeyUsage {
	m.keys.mu.Lock()
	defer m.keys.mu.Unlock()
	out := make([]KeyUsage, 0, len(m.keys.m))
	for _, k := range slices.Sorted(maps.Keys(m.keys.m)) {
		out = append(out, *m.keys.m[k])
	}
	return out
}

// AddEgress counts the bytes of one ended flow of sandbox id.
func (m *Manager) AddEgress(id string, out, in int64) {
	if out == 0 && in == 0 {
		return
	}
	m.mu.Lock()
	e := m.running[id]
	m.mu.Unlock()
	if e == nil {
		// Killed meanwhile (its last flows end as its network closes):
		// counted for its key, after its usage record.
		if actor, ok := m.recentActor(id); ok {
			m.keys.add(actor, 0, 0, out, in)
		}
		return
	}
	e.mu.Lock()
	e.use.out += out
	e.use.in += in
	actor := e.use.actor
	e.mu.Unlock()
	m.keys.add(actor, 0, 0, out, in)
}

// maxRecent bounds the killed sandboxes whose actor is remembered for
// their late flows.
const maxRecent = 4096

func (m *Manager) rememberActor(id, actor string) {
	m.recentMu.Lock()
	defer m.recentMu.Unlock()
	if m.recent == nil {
		m.recent = map[string]string{}
	}
	if len(m.recent) >= maxRecent {
		for k := range m.recent { // drop an arbitrary one
			delete(m.recent, k)
			break
		}
	}
	m.recent[id] = actor
}

func (m *Manager) recentActor(id string) (string, bool) {
	m.recentMu.Lock()
	defer m.recentMu.Unlock()
	a, ok := m.recent[id]
	return a, ok
}

// finishUsage takes a last reading of a sandbox being killed (its cgroup
// still there) and records its usage in the audit trail.
func (m *Manager) finishUsage(ctx context.Context, e *entry) {
	clock := m.now()
	e.sample(clock)
	now := clock.UTC()
	e.mu.Lock()
	u := e.use.snapshot(clock)
	u.SandboxID, u.Template, u.State = e.info.ID, e.info.TemplateID, "killed"
	e.mu.Unlock()
	u.EndedAt = &now
	m.rememberActor(u.SandboxID, u.Actor)
	b, err := json.Marshal(u)
	if err != nil {
		return
	}
	var d map[string]any
	if json.Unmarshal(b, &d) != nil {
		return
	}
	if m.audit != nil {
		m.audit.Append(context.WithoutCancel(ctx), audit.Event{Type: TypeUsage, SandboxID: u.SandboxID, Actor: u.Actor, Time: now, Data: d})
	}
}

// auditQuerier is the part of *audit.Log that reads records back.
type auditQuerier interface {
	Query(ctx context.Context, f audit.Filter) ([]audit.Record, error)
}

// Usage reports the usage of the live sandboxes and, from the audit
// trail's sandbox.usage records, of the killed ones (within the trail's
// retention) matching f, with totals per key. A sandbox's figures are
// over its whole life, not cut to [Since, Until]. Asked for one running
// sandbox, its figures are read afresh; else they are as of the last
// reading (SampleEvery).
func (m *Manager) Usage(ctx context.Context, f UsageFilter) (*UsageReport, error) {
	clock := m.now()
	rep := &UsageReport{Sandboxes: []Usage{}, Keys: []KeyUsage{}}
	m.mu.Lock()
	live := make([]*entry, 0, len(m.running))
	for id, e := range m.running {
		if f.Sandbox == "" || f.Sandbox == id {
			live = append(live, e)
		}
	}
	m.mu.Unlock()
	seen := map[string]bool{}
	for _, e := range live {
		if f.Sandbox != "" {
			e.sample(clock) // one sandbox asked for: its figures as of now
		}
		e.mu.Lock()
		u := e.use.snapshot(clock)
		u.SandboxID, u.Template, u.State = e.info.ID, e.info.TemplateID, string(e.info.State)
		e.mu.Unlock()
		if !f.Until.IsZero() && u.CreatedAt.After(f.Until) {
			continue
		}
		seen[u.SandboxID] = true
		rep.Sandboxes = append(rep.Sandboxes, u)
	}
	if q, ok := m.audit.(auditQuerier); ok {
		// A sandbox alive at some time in the range ended after Since.
		recs, err := q.Query(ctx, audit.Filter{Sandbox: f.Sandbox, Since: f.Since, Types: []string{TypeUsage}})
		if err != nil {
			return nil, fmt.Errorf("reading usage records: %w", err)
		}
		for _, r := range recs {
			var u Usage
			if json.Unmarshal(r.Data, &u) != nil || u.SandboxID == "" || seen[u.SandboxID] {
				continue
			}
			if !f.Until.IsZero() && u.CreatedAt.After(f.Until) {
				continue
			}
			seen[u.SandboxID] = true
			rep.Sandboxes = append(rep.Sandboxes, u)
		}
	}
	slices.SortFunc(rep.Sandboxes, func(a, b Usage) int { return a.CreatedAt.Compare(b.CreatedAt) })
	keys := map[string]*KeyUsage{}
	for _, u := range rep.Sandboxes {
		k := keys[u.Actor]
		if k == nil {
			k = &KeyUsage{Actor: u.Actor}
			keys[u.Actor] = k
		}
		k.Sandboxes++
		k.CPUSeconds += u.CPUSeconds
		k.MemoryGiBSeconds += u.MemoryGiBSeconds
		k.IdleSeconds += u.IdleSeconds
		k.RunningSeconds += u.RunningSeconds
		k.PausedSeconds += u.PausedSeconds
		k.EgressBytesOut += u.EgressBytesOut
		k.EgressBytesIn += u.EgressBytesIn
	}
	for _, a := range slices.Sorted(maps.Keys(keys)) {
		rep.Keys = append(rep.Keys, *keys[a])
	}
	return rep, nil
}
