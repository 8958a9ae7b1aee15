package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store/pgtest"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// openNodes opens n stores as n nodes would: on one file, or (under
// TestPostgres) each on a file of its own and one PostgreSQL database.
func openNodes(t *testing.T, n int) []*Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fence.db")
	var dsn string
	if onPostgres.Load() {
		dsn = pgtest.Database(t)
	}
	var out []*Store
	for i := range n {
		o := Options{Path: path, DatabaseURL: dsn}
		if dsn != "" {
			o.Path = filepath.Join(t.TempDir(), fmt.Sprint("node", i, ".db"))
		}
		s, err := OpenWith(t.Context(), o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out = append(out, s)
	}
	return out
}

// TestReserveAcrossNodes checks that three nodes reserving 30 sandboxes
// at once against a team's limit of 5 reserve exactly 5, with the
// team's limits as the database holds them.
func TestReserveAcrossNodes(t *testing.T) {
	nodes := openNodes(t, 3)
	ctx := t.Context()
	if err := nodes[0].SetTeamLimits(ctx, "acme", tenancy.Limits{ConcurrentSandboxes: 5}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var ok, full atomic.Int64
	expires := time.Now().Add(time.Hour)
	for i := range 30 {
		wg.Go(func() {
			n := nodes[i%3]
			err := n.Reserve(ctx, Reservation{ID: fmt.Sprint("sb", i), Team: "acme", Node: fmt.Sprint("node", i%3),
				CPUs: 0.5, MemoryMB: 256, Expires: expires}, tenancy.Limits{ConcurrentSandboxes: 100})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, api.ErrResourceExhausted):
				full.Add(1)
			default:
				t.Errorf("Reserve = %v", err)
			}
		})
	}
	wg.Wait()
	u, err := nodes[2].TeamReservations(ctx, "acme")
	if ok.Load() != 5 || full.Load() != 25 || err != nil || u.Running != 5 || u.CPUs != 2.5 || u.MemoryMB != 1280 {
		t.Fatalf("%d reserved, %d refused, usage %+v (%v); want 5, 25, 5 running", ok.Load(), full.Load(), u, err)
	}
	// Another team is not counted with this one, and has the defaults.
	if err := nodes[1].Reserve(ctx, Reservation{ID: "other", Team: "other", Node: "node1", Expires: expires}, tenancy.Limits{ConcurrentSandboxes: 1}); err != nil {
		t.Fatalf("Reserve(other team) = %v", err)
	}
	if err := nodes[1].Reserve(ctx, Reservation{ID: "other2", Team: "other", Node: "node1", Expires: expires}, tenancy.Limits{ConcurrentSandboxes: 1}); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("Reserve(other team, over its default) = %v", err)
	}
}

// TestReservationLease checks that a node's reservations stop counting
// once their expiry passes unrenewed (the node crashed), that renewed
// ones keep counting, and that pause, resume and release move the
// counters.
func TestReservationLease(t *testing.T) {
	nodes := openNodes(t, 2)
	ctx := t.Context()
	l := tenancy.Limits{ConcurrentSandboxes: 2, PausedSandboxes: 1}
	now := time.Now()
	for i, node := range []string{"live", "crashed"} {
		if err := nodes[i].Reserve(ctx, Reservation{ID: node, Team: "acme", Node: node, Expires: now.Add(time.Hour)}, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := nodes[0].Reserve(ctx, Reservation{ID: "third", Team: "acme", Node: "live", Expires: now.Add(time.Hour)}, l); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("Reserve(over the limit) = %v", err)
	}
	// The live node renews; the crashed one's lease runs out (its last
	// renewal gave an expiry now past).
	if n, err := nodes[0].RenewReservations(ctx, "live", now.Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("RenewReservations(live) = %d, %v", n, err)
	}
	if _, err := nodes[1].RenewReservations(ctx, "crashed", now.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if u, err := nodes[0].TeamReservations(ctx, "acme"); err != nil || u.Running != 1 {
		t.Fatalf("usage after the crashed node's lease ran out = %+v, %v", u, err)
	}
	if err := nodes[0].Reserve(ctx, Reservation{ID: "third", Team: "acme", Node: "live", Expires: now.Add(time.Hour)}, l); err != nil {
		t.Fatalf("Reserve(after the lease ran out) = %v", err)
	}
	// Pause one (the paused limit is 1), then the other is refused.
	if err := nodes[1].MoveReservation(ctx, "live", true, l); err != nil {
		t.Fatal(err)
	}
	if err := nodes[1].MoveReservation(ctx, "third", true, l); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("MoveReservation(over the paused limit) = %v", err)
	}
	if err := nodes[0].Reserve(ctx, Reservation{ID: "fourth", Team: "acme", Node: "live", Expires: now.Add(time.Hour)}, l); err != nil {
		t.Fatalf("Reserve(with one paused) = %v", err)
	}
	if err := nodes[0].MoveReservation(ctx, "live", false, l); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("MoveReservation(resume over the running limit) = %v", err)
	}
	if err := nodes[0].ReleaseReservation(ctx, "fourth"); err != nil {
		t.Fatal(err)
	}
	if err := nodes[0].MoveReservation(ctx, "live", false, l); err != nil {
		t.Fatalf("MoveReservation(resume) = %v", err)
	}
	if err := nodes[0].RenameReservation(ctx, "third", "sb-3"); err != nil {
		t.Fatal(err)
	}
	if err := nodes[0].DropNodeReservations(ctx, "live"); err != nil {
		t.Fatal(err)
	}
	if u, err := nodes[1].TeamReservations(ctx, "acme"); err != nil || u != (tenancy.Usage{}) {
		t.Fatalf("usage after dropping the node's = %+v, %v", u, err)
	}
}
