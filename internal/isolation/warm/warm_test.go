package warm_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/isolation/warm"
)

// counter is a Budget of max units.
type counter struct {
	mu   sync.Mutex
	max  int
	used int
}

func (c *counter) TryAcquire() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.used >= c.max {
		return false
	}
	c.used++
	return true
}

func (c *counter) Release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.used--
}

func (c *counter) inUse() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}

var target = warm.Target{RootFS: "/rootfs", Limits: isolation.Limits{CPUs: 2, MemoryBytes: 512 << 20}}

// waitRunning polls until the host runs n sandboxes.
func waitRunning(t *testing.T, host *fake.Host, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(host.Running()) != n {
		if time.Now().After(deadline) {
			t.Fatalf("host runs %v, want %d sandboxes", host.Running(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startPool starts a pool of size on a fake backend on host, with no
// budget, and waits until it has a sandbox ready.
func startPool(t *testing.T, host *fake.Host, size int) *warm.Pool {
	t.Helper()
	pool := warm.New(warm.Options{Backend: fake.New(fake.Options{Host: host}), Size: size})
	pool.Start(target, nil)
	if err := pool.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	return pool
}

func TestPool(t *testing.T) {
	host := fake.NewHost()
	pool := startPool(t, host, 2)
	ctx := t.Context()
	waitRunning(t, host, 2)
	pooled := host.Running()
	// A create with the pooled template and limits gets a pooled sandbox.
	sb, err := pool.Create(ctx, isolation.Spec{RootFS: target.RootFS, Limits: target.Limits})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pooled, sb.ID()) {
		t.Errorf("Create() = %s, want one of the pooled %v", sb.ID(), pooled)
	}
	// A create with an ID goes straight to the backend.
	other, err := pool.Create(ctx, isolation.Spec{RootFS: target.RootFS, Limits: target.Limits, ID: "named"})
	if err != nil || other.ID() != "named" {
		t.Fatalf("Create(ID named) = %v, %v", other, err)
	}
	// No sandbox is handed out twice.
	seen := map[string]bool{sb.ID(): true, other.ID(): true}
	for range 5 {
		s, err := pool.Create(ctx, isolation.Spec{RootFS: target.RootFS, Limits: target.Limits})
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
	left := host.Running()
	extra := slices.DeleteFunc(slices.Clone(left), func(id string) bool { return seen[id] })
	if len(extra) != 0 || len(left) != len(seen) {
		t.Fatalf("after Close, running %v; want exactly the %d handed out", left, len(seen))
	}
}

// TestPoolOnlyTarget: creates of any other template or limits go to the
// backend and never make the pool start sandboxes of their kind.
func TestPoolOnlyTarget(t *testing.T) {
	host := fake.NewHost()
	var mu sync.Mutex
	var specs []isolation.Spec
	be := fake.New(fake.Options{Host: host, CreateHook: func(_ context.Context, s isolation.Spec) error {
		mu.Lock()
		defer mu.Unlock()
		specs = append(specs, s)
		return nil
	}})
	pool := warm.New(warm.Options{Backend: be, Size: 2, RefillEvery: time.Millisecond})
	t.Cleanup(func() { pool.Close(context.Background()) })
	pool.Start(target, nil)
	if err := pool.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	odd := []isolation.Spec{
		{RootFS: target.RootFS, Limits: isolation.Limits{CPUs: 64, MemoryBytes: 256 << 30}},
		{RootFS: target.RootFS, Limits: isolation.Limits{CPUs: 2, MemoryBytes: 512<<20 + 1}},
		{RootFS: "/other", Limits: target.Limits},
		{RootFS: target.RootFS, Limits: target.Limits, Binds: []isolation.Bind{{HostPath: "/tmp", Path: "/mnt"}}},
	}
	for _, s := range odd {
		sb, err := pool.Create(t.Context(), s)
		if err != nil {
			t.Fatal(err)
		}
		if got := sb.(*fake.Sandbox).Spec(); got.RootFS != s.RootFS || got.Limits != s.Limits {
			t.Errorf("Create(%+v) gave a sandbox of %+v", s, got)
		}
	}
	// Let refills run several times over, then look at what was made.
	time.Sleep(100 * time.Millisecond)
	if got := pool.Held(); got != 2 {
		t.Errorf("Held() = %d, want 2", got)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range specs {
		if s.RootFS == target.RootFS && s.Limits == target.Limits && len(s.Binds) == 0 {
			continue // the pool's own, or the create with binds
		}
		if !slices.ContainsFunc(odd, func(o isolation.Spec) bool { return o.RootFS == s.RootFS && o.Limits == s.Limits }) {
			t.Errorf("backend made a sandbox of %+v nobody asked for", s)
		}
	}
	if n := len(specs); n != 2+len(odd) {
		t.Errorf("backend made %d sandboxes, want %d: the pool's 2 and the %d asked for", n, 2+len(odd), len(odd))
	}
}

// TestPoolBudget: the pool grows only while the budget has units, holds
// one per sandbox, releases it at hand-out and gives it away on Reclaim.
func TestPoolBudget(t *testing.T) {
	host := fake.NewHost()
	budget := &counter{max: 1}
	pool := warm.New(warm.Options{Backend: fake.New(fake.Options{Host: host}), Size: 3, RefillEvery: time.Millisecond})
	t.Cleanup(func() { pool.Close(context.Background()) })
	pool.Start(target, budget)
	if err := pool.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if got, used := pool.Held(), budget.inUse(); got != 1 || used != 1 {
		t.Fatalf("with a budget of 1: Held() = %d, units in use %d; want 1, 1", got, used)
	}
	// Reclaim kills the pooled sandbox and hands its unit over.
	if !pool.Reclaim(t.Context()) {
		t.Fatal("Reclaim() = false with a sandbox pooled")
	}
	waitRunning(t, host, 0)
	if got, used := pool.Held(), budget.inUse(); got != 0 || used != 1 {
		t.Fatalf("after Reclaim: Held() = %d, units in use %d; want 0, 1 (the caller's)", got, used)
	}
	if pool.Reclaim(t.Context()) {
		t.Error("Reclaim() = true with nothing pooled")
	}
	// The caller gives the unit back: the pool refills.
	budget.Release()
	if err := pool.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A hand-out releases the pooled sandbox's unit.
	if _, err := pool.Create(t.Context(), isolation.Spec{RootFS: target.RootFS, Limits: target.Limits}); err != nil {
		t.Fatal(err)
	}
	if err := pool.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if used := budget.inUse(); used != 0 {
		t.Errorf("after a hand-out and Close, units in use = %d, want 0", used)
	}
}

// TestPoolPrepare: a target's Prepare runs before a sandbox counts as
// ready; a sandbox it fails for is killed, and the pool backs off instead
// of starting sandboxes in a loop.
func TestPoolPrepare(t *testing.T) {
	host := fake.NewHost()
	var mu sync.Mutex
	prepared, fail := 0, false
	tg := target
	tg.Prepare = func(ctx context.Context, sb isolation.Sandbox) error {
		mu.Lock()
		defer mu.Unlock()
		prepared++
		if fail {
			return context.DeadlineExceeded
		}
		return nil
	}
	pool := warm.New(warm.Options{Backend: fake.New(fake.Options{Host: host}), Size: 1, RefillEvery: 10 * time.Millisecond})
	defer pool.Close(context.Background())
	pool.Start(tg, nil)
	if err := pool.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if prepared != 1 {
		t.Errorf("Prepare ran %d times for one ready sandbox", prepared)
	}
	fail = true
	mu.Unlock()
	if _, err := pool.Create(t.Context(), isolation.Spec{RootFS: tg.RootFS, Limits: tg.Limits}); err != nil {
		t.Fatal(err)
	}
	// The refill fails its Prepare: its sandbox is killed, and the next
	// attempt waits (a second at least) though the refiller ticks every
	// 10 ms.
	time.Sleep(800 * time.Millisecond)
	mu.Lock()
	attempts := prepared - 1
	mu.Unlock()
	if attempts != 1 {
		t.Errorf("%d Prepare attempts within 0.8 s of a failing Prepare, want 1 (then a back-off)", attempts)
	}
	if pool.Ready() != 0 {
		t.Errorf("a sandbox whose Prepare failed counts as ready")
	}
	waitRunning(t, host, 1) // the one handed out; the failed one was killed
}

// TestReclaimReachesChainedPools: a pool in front of another reclaims from
// the one behind when it holds nothing itself.
func TestReclaimReachesChainedPools(t *testing.T) {
	host := fake.NewHost()
	inner := warm.New(warm.Options{Backend: fake.New(fake.Options{Host: host}), Size: 1})
	defer inner.Close(context.Background())
	outer := warm.New(warm.Options{Backend: inner, Size: 1})
	defer outer.Close(context.Background())
	other := target
	other.RootFS = "/other"
	inner.Start(other, nil)
	if err := inner.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, host, 1)
	pooled := host.Running()[0]
	// The outer pool keeps nothing (never started): its Reclaim takes the
	// inner pool's sandbox.
	if !outer.Reclaim(t.Context()) {
		t.Fatal("Reclaim through a chained pool found nothing")
	}
	if slices.Contains(host.Running(), pooled) {
		t.Errorf("the inner pool's sandbox %s still runs after the reclaim", pooled)
	}
}

// A create that finds the pool empty while it is starting a sandbox takes
// that one when it is expected sooner than a create of its own would
// take, instead of starting one more beside it; a create the pool cannot
// serve in time still goes to the backend.
func TestCreateTakesTheSandboxOnItsWay(t *testing.T) {
	const startTime = 300 * time.Millisecond
	var mu sync.Mutex
	creates := 0
	host := fake.NewHost()
	backend := fake.New(fake.Options{Host: host, CreateHook: func(ctx context.Context, spec isolation.Spec) error {
		mu.Lock()
		creates++
		mu.Unlock()
		select {
		case <-time.After(startTime):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return creates
	}
	pool := warm.New(warm.Options{Backend: backend, Size: 1})
	ctx := t.Context()
	pool.Start(target, nil)
	if err := pool.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	spec := isolation.Spec{RootFS: target.RootFS, Limits: target.Limits}
	first, err := pool.Create(ctx, spec) // the pooled one; its replacement starts
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(startTime / 3)
	start := time.Now()
	second, err := pool.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 2 {
		t.Errorf("the backend made %d sandboxes for two creates from a pool of one, want 2 (the second create took the one being started)", n)
	}
	if second.ID() == first.ID() {
		t.Errorf("both creates got %s", first.ID())
	}
	t.Logf("the second create waited %v for the sandbox on its way (a start takes %v)", time.Since(start), startTime)
}

// TestQuietTakeRefillsLater: after a quiet spell, the sandbox a create
// took is replaced no sooner than 150 ms later (the sandbox's first command
// runs meanwhile), while another is ready; a take right after it is
// replaced at once.
func TestQuietTakeRefillsLater(t *testing.T) {
	const quietRefillDelay = 150 * time.Millisecond // the pool's
	host := fake.NewHost()
	pool := startPool(t, host, 2)
	ctx := t.Context()
	// Both ready (not only started): the rule holds while another is.
	for deadline := time.Now().Add(10 * time.Second); pool.Ready() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d ready after 10s, want 2", pool.Ready())
		}
	}
	waitRunning(t, host, 2)
	t0 := time.Now()
	if _, err := pool.Create(ctx, isolation.Spec{RootFS: target.RootFS, Limits: target.Limits}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, host, 3) // the one handed out, the one left, its replacement
	if d := time.Since(t0); d < quietRefillDelay {
		t.Fatalf("replaced %v after a quiet take, want no sooner than %v", d, quietRefillDelay)
	}
	waitRunning(t, host, 3)
	for range 2 { // not quiet: the second leaves none ready
		if _, err := pool.Create(ctx, isolation.Spec{RootFS: target.RootFS, Limits: target.Limits}); err != nil {
			t.Fatal(err)
		}
	}
	waitRunning(t, host, 5)
	if err := pool.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A pool whose sandboxes run services started with its environment
// (Target.SameEnv) hands them out only to creates with that same
// environment; another create gets a sandbox of its own, made with its
// environment.
func TestPoolSameEnv(t *testing.T) {
	for _, same := range []bool{false, true} {
		host := fake.NewHost()
		pool := warm.New(warm.Options{Backend: fake.New(fake.Options{Host: host}), Size: 1})
		t.Cleanup(func() { pool.Close(context.Background()) })
		tg := target
		tg.Agent = isolation.AgentConfig{EnvVars: map[string]string{"A": "pool"}}
		tg.SameEnv = same
		pool.Start(tg, nil)
		if err := pool.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
		pooled := host.Running()
		spec := isolation.Spec{RootFS: target.RootFS, Limits: target.Limits,
			Agent: isolation.AgentConfig{EnvVars: map[string]string{"A": "request"}}}
		sb, err := pool.Create(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		if handed := slices.Contains(pooled, sb.ID()); handed == same {
			t.Errorf("SameEnv %v: a create with another environment was handed a pooled sandbox: %v", same, handed)
		}
		if !same {
			continue
		}
		if err := pool.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
		pooled = host.Running()
		spec.Agent.EnvVars = map[string]string{"A": "pool"}
		sb, err = pool.Create(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(pooled, sb.ID()) {
			t.Errorf("a create with the pool's environment was not handed a pooled sandbox")
		}
	}
}
