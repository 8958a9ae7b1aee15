// Package usage accounts what fence's sandboxes use: CPU, memory over
// time, idle, running and paused time, and egress bytes, per sandbox and
// per API key; and keeps each live sandbox's recent resource readings
// (E2B's metrics).
//
// Guarantees:
//   - A live sandbox's figures are its Acc's, which the lifecycle core
//     (internal/sandbox) keeps and feeds (readings, pauses, resumes); a
//     killed sandbox's are its TypeUsage audit record, written once when
//     it is killed.
//   - Durations are measured on the clock readings the core passes, so a
//     step of the wall clock is not charged when they keep their
//     monotonic reading.
//   - The per-key counters (Counters) only grow over a daemon's run;
//     bytes of flows that end after their sandbox was killed are still
//     counted for its key (the last maxRecent killed sandboxes' keys are
//     remembered).
//   - A live sandbox's resource readings are its Ring's, the last
//     maxSamples of them; Metrics of a range that holds none and does
//     not end in the past takes one afresh.
//
// The Meter reaches the core only through Live; it never reads the
// core's records itself.
package usage

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
// sampling interval and one at kill), so GiB-seconds are exact to the
// sampling interval; idle is the running time in intervals with under 1%
// of a core used; egress counts the bytes of its flows that have ended.
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

// Report is the answer of GET /usage.
type Report struct {
	Sandboxes []Usage    `json:"sandboxes"`
	Keys      []KeyUsage `json:"keys"`
}

// Filter selects sandboxes: one by ID, and those alive at some time in
// [Since, Until] (zero: open).
type Filter struct {
	Sandbox      string
	Since, Until time.Time
}

// Live is what the Meter needs of the lifecycle core (internal/sandbox
// implements it for its Manager).
type Live interface {
	// LiveUsage returns the usage so far of the live (running or paused)
	// sandboxes, or of sandbox id alone when id is not "", whose figures
	// are then read afresh.
	LiveUsage(id string) []Usage
	// AddLiveEgress adds the bytes of one ended flow to live sandbox id's
	// usage and returns its actor; false when id is not live.
	AddLiveEgress(id string, out, in int64) (actor string, ok bool)
	// Readers returns the live sandboxes' resource readers.
	Readers() []Reader
	// Reader returns live sandbox id's resource reader, or an error
	// wrapping api.ErrNotFound when it is not live.
	Reader(id string) (Reader, error)
}

// Meter keeps the per-key counters and the usage records of killed
// sandboxes, reports usage, and reads the live sandboxes' resource use
// (Sample, Metrics).
type Meter struct {
	sink audit.Sink
	live Live
	now  func() time.Time
	keys keyTotals

	recentMu sync.Mutex
	// +checklocks:recentMu
	recent map[string]string // killed sandbox → its key, for late flows
}

// NewMeter returns a Meter over live that records killed sandboxes'
// usage in sink (nil: not recorded; Usage then reports live sandboxes
// only, as it does when sink cannot be queried) and dates readings with
// now (nil: time.Now).
func NewMeter(sink audit.Sink, live Live, now func() time.Time) *Meter {
	if now == nil {
		now = time.Now
	}
	return &Meter{sink: sink, live: live, now: now}
}

// Start starts the accounting of a sandbox created (or taken over) by
// actor at now, running or paused; its readings count for actor's key.
func (m *Meter) Start(actor string, now time.Time, paused bool) Acc {
	return Acc{keys: &m.keys, actor: actor, created: now, stateSince: now, paused: paused}
}

// Counters returns the per-key totals since this daemon started
// (CPU-seconds, GiB-seconds and egress bytes), for /metrics.
func (m *Meter) Counters() []KeyUsage {
	m.keys.mu.Lock()
	defer m.keys.mu.Unlock()
	out := make([]KeyUsage, 0, len(m.keys.m))
	for _, k := range slices.Sorted(maps.Keys(m.keys.m)) {
		out = append(out, *m.keys.m[k])
	}
	return out
}

// AddEgress counts the bytes of one ended flow of sandbox id.
func (m *Meter) AddEgress(id string, out, in int64) {
	if out == 0 && in == 0 {
		return
	}
	actor, ok := m.live.AddLiveEgress(id, out, in)
	if !ok {
		// Killed meanwhile (its last flows end as its network closes):
		// counted for its key, after its usage record.
		if actor, ok = m.recentActor(id); !ok {
			return
		}
	}
	m.keys.add(actor, 0, 0, out, in)
}

// maxRecent bounds the killed sandboxes whose actor is remembered for
// their late flows.
const maxRecent = 4096

func (m *Meter) rememberActor(id, actor string) {
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

func (m *Meter) recentActor(id string) (string, bool) {
	m.recentMu.Lock()
	defer m.recentMu.Unlock()
	a, ok := m.recent[id]
	return a, ok
}

// Finish records u, the final usage of a sandbox killed at u.EndedAt, in
// the audit trail, and remembers its actor for its late flows.
func (m *Meter) Finish(ctx context.Context, u Usage) {
	m.rememberActor(u.SandboxID, u.Actor)
	b, err := json.Marshal(u)
	if err != nil {
		return
	}
	var d map[string]any
	if json.Unmarshal(b, &d) != nil {
		return
	}
	var at time.Time
	if u.EndedAt != nil {
		at = *u.EndedAt
	}
	if m.sink != nil {
		m.sink.Append(context.WithoutCancel(ctx), audit.Event{Type: TypeUsage, SandboxID: u.SandboxID, Actor: u.Actor, Time: at, Data: d})
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
// reading.
func (m *Meter) Usage(ctx context.Context, f Filter) (*Report, error) {
	rep := &Report{Sandboxes: []Usage{}, Keys: []KeyUsage{}}
	seen := map[string]bool{}
	for _, u := range m.live.LiveUsage(f.Sandbox) {
		if !f.Until.IsZero() && u.CreatedAt.After(f.Until) {
			continue
		}
		seen[u.SandboxID] = true
		rep.Sandboxes = append(rep.Sandboxes, u)
	}
	if q, ok := m.sink.(auditQuerier); ok {
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
