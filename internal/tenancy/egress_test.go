package tenancy

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// egressMem keeps limits and the teams' egress in memory as the store
// does, counting its writes of egress and failing the next one when told.
type egressMem struct {
	memLimits
	mu     sync.Mutex
	bytes  map[egressKey]int64
	writes int
	fail   bool
}

func (m *egressMem) AddTeamEgress(_ context.Context, team string, day, bytes int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		m.fail = false
		return errors.New("store unavailable")
	}
	m.writes++
	m.bytes[egressKey{team, day}] += bytes
	return nil
}

func (m *egressMem) TeamEgress(_ context.Context, day int64) (map[string]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int64{}
	for k, n := range m.bytes {
		if k.day == day {
			out[k.team] = n
		}
	}
	return out, nil
}

func (m *egressMem) state() (writes int, bytes map[egressKey]int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[egressKey]int64{}
	for k, n := range m.bytes {
		out[k] = n
	}
	return m.writes, out
}

// Flows ending charge memory at once and the store once per team and day
// at a flush, not once per flow; the limit is checked against the exact
// count before any flush; FlushEgress (shutdown) stores everything, so a
// new Quotas on the same store loads the day whole; a charge after it is
// stored at once; bytes whose write failed are kept for the next flush.
func TestEgressChargesBatched(t *testing.T) {
	st := &egressMem{memLimits: memLimits{}, bytes: map[egressKey]int64{}}
	q, err := NewQuotas(st, Limits{EgressBytesPerDay: 1000})
	if err != nil {
		t.Fatal(err)
	}
	q.egress.mu.Lock()
	q.egress.every = time.Hour // no timer flush during the test
	q.egress.mu.Unlock()
	ctx := context.Background()
	now := time.Now()
	day := Day(now)
	for i := range 100 {
		if spent := q.ChargeEgress(ctx, "a", 10, now); spent != (i == 99) {
			t.Fatalf("flow %d: spent %v", i, spent)
		}
	}
	for range 5 {
		q.ChargeEgress(ctx, "b", 10, now)
	}
	if !q.EgressSpent("a", now) || q.EgressToday("a", now) != 1000 || q.EgressToday("b", now) != 50 {
		t.Fatalf("in memory: a %d, b %d", q.EgressToday("a", now), q.EgressToday("b", now))
	}
	if w, _ := st.state(); w != 0 {
		t.Fatalf("%d store writes for 105 flows before a flush", w)
	}

	st.mu.Lock()
	st.fail = true
	st.mu.Unlock()
	if err := q.FlushEgress(ctx); err == nil {
		t.Fatal("a failed write not reported")
	}
	if err := q.FlushEgress(ctx); err != nil {
		t.Fatal(err)
	}
	w, got := st.state()
	if w != 2 || got[egressKey{"a", day}] != 1000 || got[egressKey{"b", day}] != 50 {
		t.Fatalf("after the flushes: %d writes, %v", w, got)
	}

	q.ChargeEgress(ctx, "b", 7, now) // after the shutdown's flush
	if w, got := st.state(); w != 3 || got[egressKey{"b", day}] != 57 {
		t.Fatalf("a charge after FlushEgress: %d writes, %v", w, got)
	}

	q2, _ := NewQuotas(st, Limits{EgressBytesPerDay: 1000})
	if err := q2.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if !q2.EgressSpent("a", now) || q2.EgressToday("b", now) != 57 {
		t.Fatalf("after a restart: a %d, b %d", q2.EgressToday("a", now), q2.EgressToday("b", now))
	}
}

// Without FlushEgress, the pending bytes reach the store by themselves
// after the flush period.
func TestEgressFlushedByTimer(t *testing.T) {
	st := &egressMem{memLimits: memLimits{}, bytes: map[egressKey]int64{}}
	q, _ := NewQuotas(st, Limits{})
	q.egress.mu.Lock()
	q.egress.every = 10 * time.Millisecond
	q.egress.mu.Unlock()
	now := time.Now()
	for range 20 {
		q.ChargeEgress(context.Background(), "a", 5, now)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		w, got := st.state()
		if got[egressKey{"a", Day(now)}] == 100 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not flushed: %d writes, %v", w, got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
