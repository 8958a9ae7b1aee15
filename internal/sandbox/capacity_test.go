package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/capacity"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/isolation/warm"
	"github.com/fencesandbox/fence/internal/store"
)

// TestCapacityRefusesAndPoolYields: with a host that holds 5 sandboxes
// (10 tasks each against a pid_max of 50), a warm pool of 2 in front of
// the backend, users get all 5 (the pool gives its sandboxes back and
// stops refilling before a user is refused), the 6th create is refused
// with api.ErrUnavailable naming the limit, the host never holds more
// than 5, and a kill makes room for a create again.
func TestCapacityRefusesAndPoolYields(t *testing.T) {
	const fits = 5
	host := fake.NewHost()
	var peak atomic.Int64
	be := fake.New(fake.Options{Host: host, CreateHook: func(context.Context, isolation.Spec) error {
		n := int64(len(host.Running())) + 1
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		return nil
	}})
	gate, err := capacity.New(capacity.Options{
		Source: func() []capacity.Reading {
			return []capacity.Reading{{Limit: capacity.Tasks, Name: "kernel.pid_max", Used: 10 * int64(len(host.Running())), Max: 10 * fits}}
		},
		Cost: capacity.Costs{capacity.Tasks: 10}, Margin: capacity.Costs{},
	})
	if err != nil {
		t.Fatal(err)
	}
	pool := warm.New(warm.Options{Backend: be, Size: 2, RefillEvery: time.Millisecond})
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Options{Backend: pool, Store: st, Capacity: gate,
		Templates: templates{"base": "/rootfs/base"},
		Logger:    slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close(context.Background())
		m.Shutdown(context.Background())
		st.Close()
	})
	pool.Start(warm.Target{RootFS: "/rootfs/base", Limits: m.Defaults().Limits()}, m.PoolBudget())
	if err := pool.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range fits {
		s, err := m.Create(t.Context(), CreateRequest{TemplateID: "base"})
		if err != nil {
			t.Fatalf("create %d of %d = %v, want room (the pool's given back)", len(ids)+1, fits, err)
		}
		ids = append(ids, s.ID)
	}
	_, err = m.Create(t.Context(), CreateRequest{TemplateID: "base"})
	var ref *capacity.Refusal
	if !errors.As(err, &ref) || !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "50 of kernel.pid_max 50 tasks in use") {
		t.Fatalf("create past the host's capacity = %v, want a capacity refusal (unavailable) naming kernel.pid_max", err)
	}
	if p := peak.Load(); p > fits {
		t.Errorf("the host held %d sandboxes at once, it holds %d", p, fits)
	}
	if n := gate.Refused()[capacity.Tasks]; n != 1 {
		t.Errorf("refusals counted on tasks = %d, want 1", n)
	}
	if err := m.Kill(t.Context(), ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(t.Context(), CreateRequest{TemplateID: "base"}); err != nil {
		t.Errorf("create after a kill = %v, want the freed room", err)
	}
	if p := peak.Load(); p > fits {
		t.Errorf("the host held %d sandboxes at once, it holds %d", p, fits)
	}
}
