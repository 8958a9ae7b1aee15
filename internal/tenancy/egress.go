package tenancy

import (
	"context"
	"sync"
	"time"
)

// EgressStore keeps the bytes each team's sandboxes moved through the
// egress fence on each UTC day (day: the unix second it starts).
type EgressStore interface {
	AddTeamEgress(ctx context.Context, team string, day, bytes int64) error
	TeamEgress(ctx context.Context, day int64) (map[string]int64, error)
}

// egressState is the teams' egress bytes of the UTC day counted.
type egressState struct {
	mu sync.Mutex
	// +checklocks:mu
	day int64 // unix second of the day counted
	// +checklocks:mu
	bytes map[string]int64 // by team
}

// Day is the UTC day t is in, as the unix second it starts.
func Day(t time.Time) int64 { return t.UTC().Truncate(24 * time.Hour).Unix() }

// +checklocks:e.mu
func (e *egressState) rollLocked(day int64) {
	if e.day != day || e.bytes == nil {
		e.day, e.bytes = day, map[string]int64{}
	}
}

// loadEgress reads the teams' egress of now's day from the store.
func (q *Quotas) loadEgress(ctx context.Context, now time.Time) error {
	st, ok := q.store.(EgressStore)
	if !ok {
		return nil
	}
	day := Day(now)
	bytes, err := st.TeamEgress(ctx, day)
	if err != nil {
		return err
	}
	q.egress.mu.Lock()
	defer q.egress.mu.Unlock()
	q.egress.day, q.egress.bytes = day, bytes
	return nil
}

// ChargeEgress counts bytes a flow of team's sandboxes moved (sent and
// received) at now in team's egress of the UTC day, in the store too,
// and reports whether the day's egress is spent (EgressBytesPerDay
// reached): the team's flows open should then end.
func (q *Quotas) ChargeEgress(ctx context.Context, team string, bytes int64, now time.Time) (spent bool) {
	if bytes <= 0 {
		return q.EgressSpent(team, now)
	}
	day := Day(now)
	q.egress.mu.Lock()
	q.egress.rollLocked(day)
	q.egress.bytes[team] += bytes
	total := q.egress.bytes[team]
	q.egress.mu.Unlock()
	if st, ok := q.store.(EgressStore); ok {
		// A failed write loses these bytes over a restart only.
		_ = st.AddTeamEgress(context.WithoutCancel(ctx), team, day, bytes)
	}
	l := q.Limits(team)
	return l.EgressBytesPerDay > 0 && total >= l.EgressBytesPerDay
}

// EgressSpent reports whether team has spent its egress of now's UTC
// day: its sandboxes' new flows are refused until the day ends (or the
// limit is raised).
func (q *Quotas) EgressSpent(team string, now time.Time) bool {
	l := q.Limits(team)
	return l.EgressBytesPerDay > 0 && q.EgressToday(team, now) >= l.EgressBytesPerDay
}

// EgressToday is the bytes team's sandboxes moved through the egress
// fence on now's UTC day (the flows that ended).
func (q *Quotas) EgressToday(team string, now time.Time) int64 {
	q.egress.mu.Lock()
	defer q.egress.mu.Unlock()
	q.egress.rollLocked(Day(now))
	return q.egress.bytes[team]
}

// EgressAllToday returns every team's egress of now's UTC day (the teams
// with any).
func (q *Quotas) EgressAllToday(now time.Time) map[string]int64 {
	q.egress.mu.Lock()
	defer q.egress.mu.Unlock()
	q.egress.rollLocked(Day(now))
	out := make(map[string]int64, len(q.egress.bytes))
	for team, n := range q.egress.bytes {
		out[team] = n
	}
	return out
}
