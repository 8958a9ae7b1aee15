package warm_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/isolation/warm"
)

func TestPool(t *testing.T) {
	host := fake.NewHost()
	pool := warm.New(warm.Options{Backend: fake.New(fake.Options{Host: host}), Size: 2})
	ctx := t.Context()
	pool.Prewarm("/rootfs", isolation.Limits{})
	if err := pool.WaitReady(ctx, "/rootfs", isolation.Limits{}); err != nil {
		t.Fatal(err)
	}
	pooled := host.Running()
	if len(pooled) == 0 {
		t.Fatal("Prewarm started nothing")
	}
	// A create with the pooled template and limits gets a pooled sandbox.
	sb, err := pool.Create(ctx, isolation.Spec{RootFS: "/rootfs"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pooled, sb.ID()) {
		t.Errorf("Create() = %s, want one of the pooled %v", sb.ID(), pooled)
	}
	// A create with another key, or with binds or an ID, goes straight
	// to the backend.
	other, err := pool.Create(ctx, isolation.Spec{RootFS: "/rootfs", ID: "named"})
	if err != nil || other.ID() != "named" {
		t.Fatalf("Create(ID named) = %v, %v", other, err)
	}
	// No sandbox is handed out twice.
	seen := map[string]bool{sb.ID(): true, other.ID(): true}
	for range 5 {
		s, err := pool.Create(ctx, isolation.Spec{RootFS: "/rootfs"})
		if err != nil {
			t.Fatal(err)
		}
		if seen[s.ID()] {
			t.Fatalf("sandbox %s handed out twice", s.ID())
		}
		seen[s.ID()] = true
	}
	// Close kills the pooled ones, not those handed out.
	if err := pool.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := host.Running()
		extra := slices.DeleteFunc(slices.Clone(left), func(id string) bool { return seen[id] })
		if len(extra) == 0 && len(left) == len(seen) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Close, running %v; want exactly the %d handed out", left, len(seen))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
