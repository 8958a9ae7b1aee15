package clusterquota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/store/pgtest"
	"github.com/fencesandbox/fence/internal/tenancy"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// nodes makes n nodes' admissions on one new PostgreSQL database.
func nodes(t *testing.T, n int, defaults tenancy.Limits) ([]*Quotas, []*store.Store) {
	t.Helper()
	return nodesOn(t, pgtest.Database(t), n, defaults)
}

// nodesOn makes n nodes' admissions on the database at dsn.
func nodesOn(t *testing.T, dsn string, n int, defaults tenancy.Limits) ([]*Quotas, []*store.Store) {
	t.Helper()
	var qs []*Quotas
	var sts []*store.Store
	for i := range n {
		st, err := store.OpenWith(t.Context(), store.Options{Path: filepath.Join(t.TempDir(), "fence.db"), DatabaseURL: dsn})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		local, err := tenancy.NewQuotas(st, defaults)
		if err != nil {
			t.Fatal(err)
		}
		if err := local.Load(t.Context()); err != nil {
			t.Fatal(err)
		}
		q := New(local, st, fmt.Sprint("node", i), time.Hour)
		if err := q.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		qs = append(qs, q)
		sts = append(sts, st)
	}
	return qs, sts
}

// TestQuotaAcrossNodes checks that 30 creates at once spread over three
// nodes against a team limit of 5 set on one node admit exactly 5, that
// a removal on one node makes room on another, and that a paused limit
// holds across nodes too.
func TestQuotaAcrossNodes(t *testing.T) {
	qs, sts := nodes(t, 3, tenancy.Limits{ConcurrentSandboxes: 100})
	if err := qs[0].Set(t.Context(), "acme", tenancy.Limits{ConcurrentSandboxes: 5, PausedSandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var ok, full atomic.Int64
	for i := range 30 {
		wg.Go(func() {
			h, err := qs[i%3].Admit("acme", tenancy.Size{CPUs: 1, MemoryMB: 512})
			switch {
			case err == nil:
				ok.Add(1)
				h.Commit(fmt.Sprint("sb", i))
			case errors.Is(err, api.ErrResourceExhausted):
				full.Add(1)
			default:
				t.Errorf("Admit = %v", err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 5 || full.Load() != 25 {
		t.Fatalf("%d admitted, %d refused; want 5 and 25", ok.Load(), full.Load())
	}
	var admitted []string
	for i := range 30 {
		admitted = append(admitted, fmt.Sprint("sb", i))
	}
	if _, err := qs[2].Admit("acme", tenancy.Size{CPUs: 1}); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("Admit over the limit = %v", err)
	}
	// Removing every sandbox (each on whichever node: unknown IDs are
	// ignored) makes room for one more on any node.
	for _, id := range admitted {
		for _, q := range qs {
			q.Remove(id)
		}
	}
	h, err := qs[2].Admit("acme", tenancy.Size{CPUs: 1})
	if err != nil {
		t.Fatalf("Admit after the removals = %v", err)
	}
	h.Commit("one")
	h2, err := qs[0].Admit("acme", tenancy.Size{CPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	h2.Commit("two")
	if _, err := qs[2].Pause("one"); err != nil {
		t.Fatalf("Pause(one) = %v", err)
	}
	if _, err := qs[0].Pause("two"); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("Pause(two) over the team's paused limit on another node = %v", err)
	}
	if got := qs[0].Quotas.Usage("acme"); got.Running != 1 || got.Paused != 0 {
		t.Fatalf("node 0's usage after its refused pause = %+v", got)
	}
	// A hold cancelled gives its room back.
	h3, err := qs[1].Admit("acme", tenancy.Size{CPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	h3.Cancel()
	if u, err := sts[0].TeamReservations(t.Context(), "acme"); err != nil || u.Running != 1 || u.Paused != 1 {
		t.Fatalf("reservations after a cancelled hold = %+v, %v; want 1 running, 1 paused", u, err)
	}
}

// TestCrashedNodeReleased checks that a node that stops renewing (it
// crashed) stops holding its team's room once its lease runs out, and
// that a node starting again counts only the sandboxes it takes over.
func TestCrashedNodeReleased(t *testing.T) {
	qs, sts := nodes(t, 2, tenancy.Limits{ConcurrentSandboxes: 2})
	for i := range 2 {
		h, err := qs[1].Admit("acme", tenancy.Size{CPUs: 1})
		if err != nil {
			t.Fatal(err)
		}
		h.Commit(fmt.Sprint("crashed", i))
	}
	if _, err := qs[0].Admit("acme", tenancy.Size{CPUs: 1}); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("Admit at the limit = %v", err)
	}
	// Node 1 crashes: its last renewal's expiry passes.
	if _, err := sts[1].RenewReservations(t.Context(), "node1", time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	h, err := qs[0].Admit("acme", tenancy.Size{CPUs: 1})
	if err != nil {
		t.Fatalf("Admit after the crashed node's lease ran out = %v", err)
	}
	h.Commit("live")
	// Node 0 restarts and takes its one sandbox over.
	again := New(qs[0].Quotas, sts[0], "node0", time.Hour)
	if err := again.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	again.Adopt("live", "acme", tenancy.Size{CPUs: 1}, false)
	if u, err := sts[1].TeamReservations(t.Context(), "acme"); err != nil || u.Running != 1 {
		t.Fatalf("usage after the restart = %+v, %v; want 1 running", u, err)
	}
}

// TestDatabaseCrashMidCreate kills PostgreSQL (as kill -9 would) while
// three nodes admit and commit sandboxes without pause (30 workers, 20
// creates each, before, during and after the crash): once it is back and
// each node has renewed, the team's reservations are exactly the
// sandboxes whose creates were admitted, none leaked and none lost.
func TestDatabaseCrashMidCreate(t *testing.T) {
	srv := pgtest.New(t)
	qs, sts := nodesOn(t, srv.Database(t), 3, tenancy.Limits{ConcurrentSandboxes: 10000})
	var wg sync.WaitGroup
	var admitted, refused atomic.Int64
	for w := range 30 {
		wg.Go(func() {
			for i := range 20 {
				h, err := qs[w%3].Admit("acme", tenancy.Size{CPUs: 0.25, MemoryMB: 64})
				if err != nil {
					refused.Add(1)
					continue
				}
				h.Commit(fmt.Sprint("sb", w, "-", i))
				admitted.Add(1)
			}
		})
	}
	for admitted.Load() < 60 {
		time.Sleep(10 * time.Millisecond)
	}
	srv.Crash(t)
	wg.Wait()
	for _, q := range qs {
		var err error
		for range 40 { // a pool's connections from before the crash fail once each
			if err = q.Renew(t.Context()); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("Renew after the crash = %v", err)
		}
	}
	u, err := sts[0].TeamReservations(t.Context(), "acme")
	if err != nil || int64(u.Running) != admitted.Load() {
		t.Fatalf("after the crash: %d running reserved (%v), %d creates admitted", u.Running, err, admitted.Load())
	}
	if refused.Load() == 0 {
		t.Fatal("no create failed: the crash came after them all")
	}
	t.Logf("%d of 600 creates admitted, %d failed around the crash", admitted.Load(), refused.Load())
}

// TestRenewReconciles checks that a renewal drops a reservation of the
// node's that it does not hold (a create whose answer was lost) and
// writes again one it holds that the database lost.
func TestRenewReconciles(t *testing.T) {
	qs, sts := nodes(t, 1, tenancy.Limits{})
	h, err := qs[0].Admit("acme", tenancy.Size{CPUs: 1, MemoryMB: 100})
	if err != nil {
		t.Fatal(err)
	}
	h.Commit("kept")
	ctx := t.Context()
	stray := store.Reservation{ID: "hold-lost", Team: "acme", Node: "node0", CPUs: 1, Expires: time.Now().Add(time.Hour)}
	if err := sts[0].ForceReservation(ctx, stray); err != nil {
		t.Fatal(err)
	}
	if err := sts[0].ReleaseReservation(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	if err := qs[0].Renew(ctx); err != nil {
		t.Fatal(err)
	}
	ids, err := sts[0].NodeReservations(ctx, "node0")
	if err != nil || len(ids) != 1 || ids[0] != "kept" {
		t.Fatalf("after Renew the node's reservations are %v (%v), want [kept]", ids, err)
	}
	if u, err := sts[0].TeamReservations(ctx, "acme"); err != nil || u.Running != 1 || u.MemoryMB != 100 {
		t.Fatalf("usage after Renew = %+v, %v", u, err)
	}
}
