package tenancy

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// 50 concurrent snapshots against a limit of 10 store exactly 10, even
// though each is stored (and its hold released) at its own pace.
func TestAdmitSnapshotNoOvershoot(t *testing.T) {
	q, err := NewQuotas(nil, Limits{Snapshots: 10})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	stored := 0
	kept := func() (Kept, error) {
		mu.Lock()
		defer mu.Unlock()
		return Kept{Count: stored}, nil
	}
	var wg sync.WaitGroup
	refused := 0
	var rmu sync.Mutex
	for range 50 {
		wg.Go(func() {
			h, err := q.AdmitSnapshot("t", kept)
			if err != nil {
				if !errors.Is(err, api.ErrResourceExhausted) {
					t.Errorf("refusal %v", err)
				}
				rmu.Lock()
				refused++
				rmu.Unlock()
				return
			}
			mu.Lock()
			stored++
			mu.Unlock()
			h.Done()
		})
	}
	wg.Wait()
	if stored != 10 || refused != 40 {
		t.Fatalf("stored %d, refused %d; want 10, 40", stored, refused)
	}
}

// A snapshot's bytes are checked once known: over the limit it is
// refused and its hold gives everything back.
func TestSnapshotBytes(t *testing.T) {
	q, _ := NewQuotas(nil, Limits{SnapshotBytes: 100})
	kept := func() (Kept, error) { return Kept{Bytes: 60}, nil }
	h, err := q.AdmitSnapshot("t", kept)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Grow(50); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("Grow(50) over 60 of 100 = %v", err)
	}
	h.Done()
	h, err = q.AdmitSnapshot("t", kept)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Grow(40); err != nil {
		t.Fatalf("Grow(40) = %v", err)
	}
	if _, err := q.AdmitSnapshot("t", kept); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("an admit while 100 of 100 are held = %v", err)
	}
	h.Done()
	q.kept.mu.Lock()
	left := len(q.kept.pending)
	q.kept.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d teams' pending snapshots left", left)
	}
}

// A team's egress is spent at its limit, for its day alone, and not for
// another team.
func TestEgressDay(t *testing.T) {
	q, _ := NewQuotas(nil, Limits{EgressBytesPerDay: 1000})
	day := time.Date(2026, 12, 7, 23, 0, 0, 0, time.UTC)
	ctx := context.Background()
	if q.ChargeEgress(ctx, "a", 600, day) || q.EgressSpent("a", day) {
		t.Fatal("spent at 600 of 1000")
	}
	if !q.ChargeEgress(ctx, "a", 400, day) || !q.EgressSpent("a", day) {
		t.Fatal("not spent at 1000 of 1000")
	}
	if q.EgressSpent("b", day) {
		t.Fatal("another team spent")
	}
	next := day.Add(2 * time.Hour) // 01:00 UTC the next day
	if q.EgressSpent("a", next) || q.EgressToday("a", next) != 0 {
		t.Fatal("the next UTC day starts spent")
	}
}

// Team metrics: the most running in each step, starts per second.
func TestTeamMetrics(t *testing.T) {
	q, _ := NewQuotas(nil, Limits{})
	start := time.Now().Add(-time.Minute)
	h1, _ := q.Admit("t", Size{})
	h1.Commit("s1")
	h2, _ := q.Admit("t", Size{})
	h2.Commit("s2")
	q.Remove("s1")
	ms := q.TeamMetrics("t", start, time.Now())
	best, starts := int32(0), 0.0
	for _, m := range ms {
		best = max(best, m.ConcurrentSandboxes)
		starts += m.SandboxStartRate * 5
	}
	if best != 2 || starts < 1.99 || starts > 2.01 {
		t.Fatalf("metrics %+v: max %d, starts %v; want 2, 2", ms, best, starts)
	}
	if got := q.TeamMetrics("other", start, time.Now()); len(got) != 0 {
		t.Fatalf("a team with no sandbox has metrics %+v", got)
	}
}
