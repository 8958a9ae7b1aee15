package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/isolation/warm"
	"github.com/fencesandbox/fence/internal/store"
)

// TestWarmPoolCountsAgainstMax: with a warm pool in front of the backend,
// the sandboxes on the host (pooled ones included) never exceed
// MaxSandboxes, a create at the cap takes room back from the pool whatever
// its limits, and only the default template and limits are pooled.
func TestWarmPoolCountsAgainstMax(t *testing.T) {
	const max, size = 3, 2
	host := fake.NewHost()
	var peak, over atomic.Int64
	be := fake.New(fake.Options{Host: host, CreateHook: func(context.Context, isolation.Spec) error {
		n := int64(len(host.Running())) + 1 // this one included
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if n > max {
			over.Add(1)
		}
		return nil
	}})
	pool := warm.New(warm.Options{Backend: be, Size: size, RefillEvery: time.Millisecond})
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Options{Backend: pool, Store: st, MaxSandboxes: max,
		Templates: templates{"base": "/rootfs/base", "minimal": "/rootfs/minimal"},
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
	settle := func() { time.Sleep(30 * time.Millisecond) } // let refills run

	// Odd limits and another template: served cold, never pooled. The
	// second one is at the cap (1 running + 2 pooled) and takes a pooled
	// sandbox's room.
	reqs := []CreateRequest{
		{TemplateID: "base", CPUs: 7, MemoryMB: 777},
		{TemplateID: "minimal"},
	}
	var ids []string
	for _, req := range reqs {
		s, err := m.Create(t.Context(), req)
		if err != nil {
			t.Fatalf("Create(%+v) = %v, want room taken from the pool", req, err)
		}
		ids = append(ids, s.ID)
		settle()
		if n := len(host.Running()); n > max {
			t.Fatalf("after Create(%+v) the host runs %d sandboxes, max %d", req, n, max)
		}
	}
	// A default create takes the last pooled sandbox.
	s, err := m.Create(t.Context(), CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatalf("Create(default) at the cap with one pooled = %v", err)
	}
	ids = append(ids, s.ID)
	settle()
	if held := pool.Held(); held != 0 {
		t.Errorf("pool holds %d with %d of %d running, want 0", held, len(ids), max)
	}
	// Full: nothing more.
	if _, err := m.Create(t.Context(), CreateRequest{TemplateID: "base"}); !errors.Is(err, api.ErrResourceExhausted) {
		t.Errorf("Create() past the cap = %v, want ErrResourceExhausted", err)
	}
	// A kill frees one unit: the pool takes it back, not more.
	if err := m.Kill(t.Context(), ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := pool.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	settle()
	if held := pool.Held(); held != 1 {
		t.Errorf("pool holds %d after a kill at the cap, want 1", held)
	}
	for _, sb := range host.Running() {
		fs, _ := host.Sandbox(sb)
		if fs == nil {
			continue
		}
		if sp := fs.Spec(); sp.RootFS == "/rootfs/base" && sp.Limits != m.Defaults().Limits() && sp.Limits.CPUs != 7 {
			t.Errorf("sandbox %s has limits %+v nobody asked for", sb, sp.Limits)
		}
	}
	if o := over.Load(); o > 0 {
		t.Errorf("%d creates took the host past %d sandboxes (peak %d)", o, max, peak.Load())
	}
	t.Logf("peak sandboxes on the host: %d (max %d)", peak.Load(), max)
}

// slowKillBackend makes sandboxes whose Kill waits for release.
type slowKillBackend struct {
	isolation.Backend
	release chan struct{}
}

type slowKillSandbox struct {
	isolation.Sandbox
	release chan struct{}
}

func (b slowKillBackend) Create(ctx context.Context, spec isolation.Spec) (isolation.Sandbox, error) {
	sb, err := b.Backend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return slowKillSandbox{sb, b.release}, nil
}

func (s slowKillSandbox) Kill(ctx context.Context) error {
	<-s.release
	return s.Sandbox.Kill(ctx)
}

// TestCapacityHeldUntilKilled: a sandbox being killed still counts against
// MaxSandboxes until the backend has released it, so a create (or a warm
// pool's refill) cannot start one more meanwhile.
func TestCapacityHeldUntilKilled(t *testing.T) {
	release := make(chan struct{})
	e := newEnv(t, func(o *Options) {
		o.MaxSandboxes = 1
		o.Backend = slowKillBackend{o.Backend, release}
	})
	a := e.mustCreate(t, CreateRequest{})
	killed := make(chan error, 1)
	go func() { killed <- e.m.Kill(context.Background(), a.ID) }()
	for n, _ := e.m.Counts(); n != 0; n, _ = e.m.Counts() { // Kill has taken it out of the running set
		time.Sleep(time.Millisecond)
	}
	if _, err := e.m.Create(t.Context(), CreateRequest{TemplateID: "base"}); !errors.Is(err, api.ErrResourceExhausted) {
		t.Errorf("Create() while the only sandbox is being killed = %v, want ErrResourceExhausted (the host still holds it)", err)
	}
	if ok := e.m.PoolBudget().TryAcquire(); ok {
		t.Errorf("PoolBudget().TryAcquire() while the only sandbox is being killed = true, want false")
	}
	close(release)
	if err := <-killed; err != nil {
		t.Fatal(err)
	}
	e.mustCreate(t, CreateRequest{})
}
