package tenancy

import (
	"cmp"
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

// EgressFlushEvery is how long the bytes a flow charges wait in memory
// before they are added to the store: the store is written at most once
// per team and day in each such period, not once per flow. A daemon that
// ends without FlushEgress (a crash, a power cut) loses at most the bytes
// charged in its last period from the day's count it reads at its next
// start; the count it checks the limit against while it runs is exact.
const EgressFlushEvery = 5 * time.Second

// egressState is the teams' egress bytes of the UTC day counted.
type egressState struct {
	mu sync.Mutex
	// +checklocks:mu
	day int64 // unix second of the day counted
	// +checklocks:mu
	bytes map[string]int64 // by team
	// +checklocks:mu
	pending map[egressKey]int64 // charged but not yet in the store
	// +checklocks:mu
	timer *time.Timer // the flush of pending armed, nil when none is
	// +checklocks:mu
	closed bool // FlushEgress at shutdown ran: later charges write at once
	// +checklocks:mu
	every time.Duration // the flush period; 0: EgressFlushEvery

	flushMu sync.Mutex // one flush writes at a time, in charge order
}

// egressKey names a team's day in the pending bytes.
type egressKey struct {
	team string
	day  int64
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
// received) at now in team's egress of the UTC day, and reports whether
// the day's egress is spent (EgressBytesPerDay reached): the team's flows
// open should then end. The count in memory is exact at once; the store
// gets the bytes within EgressFlushEvery (one write per team and day for
// all the flows that ended meanwhile) or at FlushEgress.
func (q *Quotas) ChargeEgress(ctx context.Context, team string, bytes int64, now time.Time) (spent bool) {
	if bytes <= 0 {
		return q.EgressSpent(team, now)
	}
	day := Day(now)
	_, stored := q.store.(EgressStore)
	q.egress.mu.Lock()
	q.egress.rollLocked(day)
	q.egress.bytes[team] += bytes
	total := q.egress.bytes[team]
	writeNow := false
	if stored {
		if q.egress.pending == nil {
			q.egress.pending = map[egressKey]int64{}
		}
		q.egress.pending[egressKey{team, day}] += bytes
		writeNow = q.egress.closed
		q.armFlushLocked(ctx)
	}
	q.egress.mu.Unlock()
	if writeNow {
		_ = q.flushEgress(context.WithoutCancel(ctx), false)
	}
	l := q.Limits(team)
	return l.EgressBytesPerDay > 0 && total >= l.EgressBytesPerDay
}

// FlushEgress adds the bytes charged and not yet stored to the store now,
// and writes each later charge at once: the daemon calls it as it shuts
// down, after its sandboxes' flows ended, so that the day's count
// survives the restart whole.
func (q *Quotas) FlushEgress(ctx context.Context) error {
	q.egress.mu.Lock()
	q.egress.closed = true
	if q.egress.timer != nil {
		q.egress.timer.Stop()
		q.egress.timer = nil
	}
	q.egress.mu.Unlock()
	return q.flushEgress(ctx, false)
}

// flushEgress writes the pending bytes to the store, one write per team
// and day. Bytes a write failed for stay pending for the next flush
// (fromTimer: this flush is the armed timer's, which it disarms, and it
// arms another when bytes are left).
func (q *Quotas) flushEgress(ctx context.Context, fromTimer bool) error {
	st, ok := q.store.(EgressStore)
	if !ok {
		return nil
	}
	q.egress.flushMu.Lock()
	defer q.egress.flushMu.Unlock()
	q.egress.mu.Lock()
	pending := q.egress.pending
	q.egress.pending = nil
	if fromTimer {
		q.egress.timer = nil
	}
	q.egress.mu.Unlock()
	var first error
	failed := map[egressKey]int64{}
	for k, n := range pending {
		if err := st.AddTeamEgress(ctx, k.team, k.day, n); err != nil {
			failed[k] = n
			if first == nil {
				first = err
			}
		}
	}
	if len(failed) > 0 {
		q.egress.mu.Lock()
		if q.egress.pending == nil {
			q.egress.pending = map[egressKey]int64{}
		}
		for k, n := range failed {
			q.egress.pending[k] += n
		}
		q.armFlushLocked(ctx)
		q.egress.mu.Unlock()
	}
	return first
}

// armFlushLocked arms the flush of the pending bytes in EgressFlushEvery
// unless one is armed or FlushEgress ran.
//
// +checklocks:q.egress.mu
func (q *Quotas) armFlushLocked(ctx context.Context) {
	if q.egress.closed || q.egress.timer != nil {
		return
	}
	ctx = context.WithoutCancel(ctx)
	q.egress.timer = time.AfterFunc(cmp.Or(q.egress.every, EgressFlushEvery), func() { _ = q.flushEgress(ctx, true) })
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
