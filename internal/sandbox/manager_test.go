package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/store"
)

type templates map[string]string

func (ts templates) Resolve(name string) (string, error) {
	if p, ok := ts[name]; ok {
		return p, nil
	}
	return "", fmt.Errorf("template %q: %w", name, api.ErrNotFound)
}

type env struct {
	m     *Manager
	store *store.Store
	host  *fake.Host
}

type envOpt func(*Options)

func newEnv(t *testing.T, opts ...envOpt) *env {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	host := fake.NewHost()
	o := Options{
		Backend:   fake.New(fake.Options{Host: host}),
		Store:     st,
		Templates: templates{"base": "/rootfs/base", "minimal": "/rootfs/minimal"},
		Logger:    slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	for _, f := range opts {
		f(&o)
	}
	m, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatalf("Start() = %v", err)
	}
	t.Cleanup(func() {
		m.Shutdown(context.Background())
		st.Close()
	})
	return &env{m: m, store: st, host: host}
}

func (e *env) mustCreate(t *testing.T, req CreateRequest) *Sandbox {
	t.Helper()
	if req.TemplateID == "" {
		req.TemplateID = "base"
	}
	s, err := e.m.Create(t.Context(), req)
	if err != nil {
		t.Fatalf("Create(%+v) = %v", req, err)
	}
	return s
}

func TestCreateGetKill(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	s := e.mustCreate(t, CreateRequest{Metadata: map[string]string{"k": "v"}, EnvVars: map[string]string{"SECRET": "x"}})
	if !api.ValidSandboxID(s.ID) || len(s.ID) != 20 {
		t.Errorf("ID = %q, want 20 chars of [a-z0-9]", s.ID)
	}
	if s.EnvdAccessToken == "" || s.State != StateRunning || s.CPUs != 1 || s.MemoryMB != 512 || s.DiskMB != 1024 {
		t.Errorf("Create() = %+v, want token, running, defaults 2/512/1024", s)
	}
	if got := s.EndAt.Sub(s.StartedAt); got != 5*time.Minute {
		t.Errorf("EndAt-StartedAt = %v, want 5m default", got)
	}
	fs, ok := e.host.Sandbox(s.ID)
	if !ok {
		t.Fatalf("backend has no sandbox %s", s.ID)
	}
	spec := fs.Spec()
	if spec.RootFS != "/rootfs/base" || spec.Agent.EnvVars["SECRET"] != "x" || spec.Limits.MemoryBytes != 512<<20 ||
		spec.Limits.Pids != 1024 || spec.Limits.NoFile != 1024 {
		t.Errorf("backend spec = %+v", spec)
	}
	got, err := e.m.Get(ctx, s.ID)
	if err != nil || got.ID != s.ID || got.Metadata["k"] != "v" {
		t.Errorf("Get(%s) = %+v, %v", s.ID, got, err)
	}
	if box, info, ok := lookupRunning(e.m, s.ID); !ok || box.ID() != s.ID || info.EnvdAccessToken != s.EnvdAccessToken {
		t.Errorf("lookupRunning(%s) = %v, %+v, %v", s.ID, box, info, ok)
	}
	if ms, err := e.m.Meter().Metrics(ctx, s.ID, time.Time{}, time.Time{}); err != nil || len(ms) == 0 {
		t.Errorf("Metrics(%s) = %d readings, %v; want at least one", s.ID, len(ms), err)
	}
	if err := e.m.Kill(ctx, s.ID); err != nil {
		t.Fatalf("Kill(%s) = %v", s.ID, err)
	}
	if err := e.m.Kill(ctx, s.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("second Kill(%s) = %v, want ErrNotFound", s.ID, err)
	}
	if _, err := e.m.Get(ctx, s.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get(killed) = %v, want ErrNotFound", err)
	}
	if _, _, ok := lookupRunning(e.m, s.ID); ok {
		t.Errorf("lookupRunning(killed) = ok, want false")
	}
	if got := e.host.Running(); len(got) != 0 {
		t.Errorf("backend still runs %v", got)
	}
	rec, err := e.store.Get(ctx, s.ID)
	if err != nil || rec.State != store.StateKilled {
		t.Errorf("store record = %+v, %v; want killed", rec, err)
	}
}

func TestCreateInvalid(t *testing.T) {
	big := map[string]string{}
	for i := range 101 {
		big[fmt.Sprint(i)] = "v"
	}
	tests := []struct {
		name string
		req  CreateRequest
		want error
	}{
		{"no template", CreateRequest{}, api.ErrInvalidArgument},
		{"unknown template", CreateRequest{TemplateID: "nope"}, api.ErrNotFound},
		{"negative timeout", CreateRequest{TemplateID: "base", Timeout: -time.Second}, api.ErrInvalidArgument},
		{"timeout too long", CreateRequest{TemplateID: "base", Timeout: 25 * time.Hour}, api.ErrInvalidArgument},
		{"negative cpu", CreateRequest{TemplateID: "base", CPUs: -1}, api.ErrInvalidArgument},
		{"absurd cpu", CreateRequest{TemplateID: "base", CPUs: 1000}, api.ErrInvalidArgument},
		{"tiny memory", CreateRequest{TemplateID: "base", MemoryMB: 1}, api.ErrInvalidArgument},
		{"absurd memory", CreateRequest{TemplateID: "base", MemoryMB: 1 << 40}, api.ErrInvalidArgument},
		{"negative disk", CreateRequest{TemplateID: "base", DiskMB: -5}, api.ErrInvalidArgument},
		{"too much metadata", CreateRequest{TemplateID: "base", Metadata: big}, api.ErrInvalidArgument},
		{"empty metadata key", CreateRequest{TemplateID: "base", Metadata: map[string]string{"": "v"}}, api.ErrInvalidArgument},
		{"bad env name", CreateRequest{TemplateID: "base", EnvVars: map[string]string{"A=B": "v"}}, api.ErrInvalidArgument},
		{"nul in env", CreateRequest{TemplateID: "base", EnvVars: map[string]string{"A": "x\x00y"}}, api.ErrInvalidArgument},
	}
	e := newEnv(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.m.Create(t.Context(), tt.req)
			if !errors.Is(err, tt.want) {
				t.Errorf("Create(%s) = %v, want %v", tt.name, err, tt.want)
			}
		})
	}
	recs, _ := e.store.List(t.Context(), store.Filter{})
	if len(recs) != 0 || len(e.host.Running()) != 0 {
		t.Errorf("invalid creates left %d records and %v sandboxes", len(recs), e.host.Running())
	}
}

func TestCreateBackendFailureLeavesNothing(t *testing.T) {
	boom := errors.New("boom")
	e := newEnv(t, func(o *Options) {
		o.Backend = fake.New(fake.Options{CreateHook: func(context.Context, isolation.Spec) error { return boom }})
	})
	if _, err := e.m.Create(t.Context(), CreateRequest{TemplateID: "base"}); !errors.Is(err, boom) {
		t.Fatalf("Create() = %v, want boom", err)
	}
	recs, _ := e.store.List(t.Context(), store.Filter{})
	if len(recs) != 0 {
		t.Errorf("failed create left %d records", len(recs))
	}
	// The capacity reservation was released.
	pending := e.m.adm.inFlight()
	if pending != 0 {
		t.Errorf("pending = %d after failed create, want 0", pending)
	}
}

func TestMaxSandboxes(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxSandboxes = 2 })
	a := e.mustCreate(t, CreateRequest{})
	e.mustCreate(t, CreateRequest{})
	if _, err := e.m.Create(t.Context(), CreateRequest{TemplateID: "base"}); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("third Create() = %v, want ErrResourceExhausted", err)
	}
	if err := e.m.Kill(t.Context(), a.ID); err != nil {
		t.Fatal(err)
	}
	e.mustCreate(t, CreateRequest{})
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestTimeouts(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	e := newEnv(t, func(o *Options) { o.Now = clk.Now })
	ctx := t.Context()
	s := e.mustCreate(t, CreateRequest{Timeout: time.Minute})
	end := func() time.Time {
		t.Helper()
		got, err := e.m.Get(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.EndAt
	}
	t0 := clk.Now()
	if got, want := end(), t0.Add(time.Minute); !got.Equal(want) {
		t.Errorf("EndAt = %v, want %v", got, want)
	}
	if err := e.m.SetTimeout(ctx, s.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, want := end(), t0.Add(10*time.Second); !got.Equal(want) {
		t.Errorf("after SetTimeout(10s): EndAt = %v, want %v (shortened)", got, want)
	}
	if err := e.m.Extend(ctx, s.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, want := end(), t0.Add(10*time.Second); !got.Equal(want) {
		t.Errorf("after Extend(5s): EndAt = %v, want %v (unchanged)", got, want)
	}
	if err := e.m.Extend(ctx, s.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, want := end(), t0.Add(time.Hour); !got.Equal(want) {
		t.Errorf("after Extend(1h): EndAt = %v, want %v", got, want)
	}
	rec, _ := e.store.Get(ctx, s.ID)
	if !rec.EndAt.Equal(t0.Add(time.Hour)) {
		t.Errorf("stored EndAt = %v, want %v", rec.EndAt, t0.Add(time.Hour))
	}
	for _, d := range []time.Duration{0, -time.Second, 25 * time.Hour} {
		if err := e.m.SetTimeout(ctx, s.ID, d); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("SetTimeout(%v) = %v, want ErrInvalidArgument", d, err)
		}
	}
	if err := e.m.SetTimeout(ctx, "unknown", time.Minute); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("SetTimeout(unknown) = %v, want ErrNotFound", err)
	}
	// The reaper kills at the deadline; reap is what its timer calls.
	clk.Advance(time.Hour)
	e.m.reap(ctx)
	if _, err := e.m.Get(ctx, s.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get(expired) = %v, want ErrNotFound", err)
	}
	// The reaper goroutine may have taken the kill first; it finishes it
	// shortly.
	for deadline := time.Now().Add(10 * time.Second); len(e.host.Running()) != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("expired sandbox still on the backend: %v", e.host.Running())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReaperTimer runs the real reaper goroutine in a synctest bubble: the
// sandbox dies at its deadline, not before.
func TestReaperTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		ctx := t.Context()
		s := e.mustCreate(t, CreateRequest{Timeout: 10 * time.Second})
		if err := e.m.SetTimeout(ctx, s.ID, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * time.Second)
		synctest.Wait()
		if _, err := e.m.Get(ctx, s.ID); err != nil {
			t.Fatalf("Get() before the deadline = %v", err)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if _, err := e.m.Get(ctx, s.ID); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("Get() after the deadline = %v, want ErrNotFound", err)
		}
		e.m.Shutdown(ctx)
		e.store.Close()
	})
}

// TestReaperDeadlines: the reaper goroutine, told of new deadlines
// without going over every sandbox, kills each sandbox at its own
// deadline: ones created later with earlier deadlines, ones shortened,
// ones extended past the time it had planned to wake, ones resumed.
func TestReaperDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		ctx := t.Context()
		start := time.Now()
		create := func(d time.Duration) string {
			return e.mustCreate(t, CreateRequest{Timeout: d}).ID
		}
		alive := func(at time.Duration, want map[string]bool) {
			t.Helper()
			time.Sleep(time.Until(start.Add(at)))
			synctest.Wait()
			for id, w := range want {
				_, err := e.m.Get(ctx, id)
				if got := err == nil; got != w {
					t.Errorf("at %v: sandbox %s alive %v (%v), want %v", at, id, got, err, w)
				}
			}
		}
		a := create(10 * time.Second)
		synctest.Wait()
		b := create(3 * time.Second) // earlier than what the reaper waits for
		alive(2500*time.Millisecond, map[string]bool{a: true, b: true})
		alive(3500*time.Millisecond, map[string]bool{a: true, b: false})

		c := create(6 * time.Second) // at 9.5 s, extended to 23.5 s
		d := create(8 * time.Second) // at 11.5 s, shortened to 5.5 s
		p := create(time.Hour)       // paused, then resumed for 3 s
		if err := e.m.SetTimeout(ctx, c, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := e.m.SetTimeout(ctx, d, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := e.m.Pauses().Pause(ctx, p, WithMemory); err != nil {
			t.Fatal(err)
		}
		alive(5*time.Second, map[string]bool{a: true, c: true, d: true, p: true})
		alive(6*time.Second, map[string]bool{a: true, c: true, d: false, p: true})
		if _, err := e.m.Pauses().Resume(ctx, p, 3*time.Second, nil, WithMemory); err != nil {
			t.Fatal(err)
		}
		alive(8800*time.Millisecond, map[string]bool{a: true, c: true, p: true})
		alive(9500*time.Millisecond, map[string]bool{a: true, c: true, p: false})
		alive(10500*time.Millisecond, map[string]bool{a: false, c: true})
		alive(23*time.Second, map[string]bool{c: true})
		alive(24*time.Second, map[string]bool{c: false})
		e.m.Shutdown(ctx)
		e.store.Close()
	})
}

func TestAgentDeath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		ctx := t.Context()
		s := e.mustCreate(t, CreateRequest{})
		fs, _ := e.host.Sandbox(s.ID)
		fs.Crash()
		synctest.Wait()
		if _, err := e.m.Get(ctx, s.ID); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("Get(crashed) = %v, want ErrNotFound", err)
		}
		rec, err := e.store.Get(ctx, s.ID)
		if err != nil || rec.State != store.StateKilled {
			t.Errorf("store record = %+v, %v; want killed", rec, err)
		}
		e.m.Shutdown(ctx)
		e.store.Close()
	})
}

func TestCrashRecovery(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	host := fake.NewHost()
	opts := Options{Backend: fake.New(fake.Options{Host: host}), Store: st, Templates: templates{"base": "/r"}}
	m1, _ := New(opts)
	if err := m1.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Stopped only once the test is over (before the store closes): its
	// goroutines, which a real crash would end, must not use the store
	// while the test's directory is removed.
	defer m1.Shutdown(context.Background())
	s, err := m1.Create(ctx, CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	// m1 "crashes": it is dropped without Shutdown. A new daemon starts.
	opts.Backend = fake.New(fake.Options{Host: host})
	m2, _ := New(opts)
	if err := m2.Start(ctx); err != nil {
		t.Fatalf("Start() = %v", err)
	}
	defer m2.Shutdown(ctx)
	rec, err := st.Get(ctx, s.ID)
	if err != nil || rec.State != store.StateKilled {
		t.Errorf("record after recovery = %+v, %v; want killed", rec, err)
	}
	if got := host.Running(); len(got) != 0 {
		t.Errorf("host after recovery runs %v, want nothing", got)
	}
	if _, err := m2.Get(ctx, s.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get(recovered) = %v, want ErrNotFound", err)
	}
}

func TestListAndPaging(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	e := newEnv(t, func(o *Options) { o.Now = clk.Now })
	ctx := t.Context()
	var made []*Sandbox
	for i := range 5 {
		clk.Advance(time.Second)
		md := map[string]string{"i": fmt.Sprint(i), "group": "a"}
		if i%2 == 1 {
			md["group"] = "b"
		}
		made = append(made, e.mustCreate(t, CreateRequest{Metadata: md}))
	}
	e.mustCreate(t, CreateRequest{TemplateID: "minimal"}) // same StartedAt as made[4]: the ID breaks the tie
	if err := e.m.Kill(ctx, made[2].ID); err != nil {
		t.Fatal(err)
	}
	list := func(f ListFilter) []string {
		t.Helper()
		got, err := e.m.List(ctx, f)
		if err != nil {
			t.Fatalf("List(%+v) = %v", f, err)
		}
		var ids []string
		for _, s := range got {
			ids = append(ids, s.ID)
		}
		return ids
	}
	if got := list(ListFilter{Metadata: map[string]string{"group": "a"}}); fmt.Sprint(got) != fmt.Sprint([]string{made[4].ID, made[0].ID}) {
		t.Errorf("List(group=a) = %v, want [%s %s] (killed excluded, newest first)", got, made[4].ID, made[0].ID)
	}
	if got := list(ListFilter{States: []State{StatePaused}}); len(got) != 0 {
		t.Errorf("List(paused) = %v, want none", got)
	}
	if got := list(ListFilter{Template: "minimal"}); len(got) != 1 {
		t.Errorf("List(template=minimal) = %v, want 1", got)
	}
	if _, err := e.m.List(ctx, ListFilter{States: []State{"bogus"}}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("List(state=bogus) = %v, want ErrInvalidArgument", err)
	}
	if _, err := e.m.List(ctx, ListFilter{PageToken: "!!"}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("List(bad token) = %v, want ErrInvalidArgument", err)
	}
	// Page through everything two at a time.
	var all []string
	f := ListFilter{Limit: 2}
	for range 10 {
		page, err := e.m.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page {
			all = append(all, s.ID)
		}
		if len(page) < 2 {
			break
		}
		last := page[len(page)-1]
		f.PageToken = api.PageToken(last.StartedAt, last.ID)
	}
	if want := list(ListFilter{}); fmt.Sprint(all) != fmt.Sprint(want) || len(all) != 5 {
		t.Errorf("paged = %v, want %v (5 running)", all, want)
	}
}

func TestConcurrentCreates(t *testing.T) {
	e := newEnv(t)
	const n = 50
	var wg sync.WaitGroup
	ids := make(chan string, n)
	for range n {
		wg.Go(func() {
			s, err := e.m.Create(t.Context(), CreateRequest{TemplateID: "base"})
			if err != nil {
				t.Errorf("Create() = %v", err)
				return
			}
			ids <- s.ID
		})
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		if seen[id] {
			t.Errorf("duplicate ID %s", id)
		}
		seen[id] = true
	}
	if got, _ := e.m.List(t.Context(), ListFilter{}); len(got) != n || len(e.host.Running()) != n {
		t.Errorf("List() = %d, backend %d; want %d", len(got), len(e.host.Running()), n)
	}
}

func TestShutdown(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	s := e.mustCreate(t, CreateRequest{})
	if err := e.m.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown() = %v", err)
	}
	if len(e.host.Running()) != 0 {
		t.Errorf("after Shutdown the backend runs %v", e.host.Running())
	}
	if rec, _ := e.store.Get(ctx, s.ID); rec.State != store.StateKilled {
		t.Errorf("record state = %q, want killed", rec.State)
	}
	if _, err := e.m.Create(ctx, CreateRequest{TemplateID: "base"}); !errors.Is(err, ErrClosed) {
		t.Errorf("Create() after Shutdown = %v, want ErrClosed", err)
	}
	if err := e.m.Shutdown(ctx); err != nil {
		t.Errorf("second Shutdown() = %v", err)
	}
}

func TestNewID(t *testing.T) {
	for range 1000 {
		if id := isolation.NewID(); len(id) != 20 || !api.ValidSandboxID(id) {
			t.Fatalf("isolation.NewID() = %q", id)
		}
	}
	for _, id := range []string{"", "ABC", "a/b", "..", "a-b", string(make([]byte, 65))} {
		if api.ValidSandboxID(id) {
			t.Errorf("api.ValidSandboxID(%q) = true, want false", id)
		}
	}
}

// TestMetricsHistory runs the sampler in a synctest bubble: readings pile
// up at the interval, and a range selects among them.
func TestMetricsHistory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(o *Options) { o.SampleEvery = time.Second })
		ctx := t.Context()
		s := e.mustCreate(t, CreateRequest{Timeout: time.Hour})
		time.Sleep(10*time.Second + time.Millisecond)
		synctest.Wait()
		all, err := e.m.Meter().Metrics(ctx, s.ID, time.Time{}, time.Time{})
		if err != nil || len(all) < 9 || len(all) > 11 {
			t.Fatalf("Metrics(all) = %d samples, %v; want about 10", len(all), err)
		}
		for i := 1; i < len(all); i++ {
			if !all[i].At.After(all[i-1].At) {
				t.Errorf("samples out of order at %d: %v then %v", i, all[i-1].At, all[i].At)
			}
		}
		some, err := e.m.Meter().Metrics(ctx, s.ID, all[2].At, all[4].At)
		if err != nil || len(some) != 3 {
			t.Errorf("Metrics(range of 3) = %d samples, %v", len(some), err)
		}
		if _, err := e.m.Meter().Metrics(ctx, "unknown", time.Time{}, time.Time{}); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("Metrics(unknown) = %v, want ErrNotFound", err)
		}
		e.m.Shutdown(ctx)
	})
}

// TestMetricsEgress: a reading carries the bytes of the sandbox's flows
// ended before it, as running totals.
func TestMetricsEgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(o *Options) { o.SampleEvery = time.Second })
		ctx := t.Context()
		s := e.mustCreate(t, CreateRequest{Timeout: time.Hour})
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		e.m.Meter().AddEgress(s.ID, 1000, 5000)
		e.m.Meter().AddEgress(s.ID, 24, 120)
		time.Sleep(time.Second)
		synctest.Wait()
		all, err := e.m.Meter().Metrics(ctx, s.ID, time.Time{}, time.Time{})
		if err != nil || len(all) < 2 {
			t.Fatalf("Metrics = %d samples, %v", len(all), err)
		}
		if first := all[0]; first.EgressOut != 0 || first.EgressIn != 0 {
			t.Errorf("the reading before any flow: egress %d/%d, want 0/0", first.EgressOut, first.EgressIn)
		}
		if last := all[len(all)-1]; last.EgressOut != 1024 || last.EgressIn != 5120 {
			t.Errorf("the reading after two flows: egress %d/%d, want 1024/5120", last.EgressOut, last.EgressIn)
		}
		e.m.Shutdown(ctx)
	})
}

// insertFails is a store whose Insert fails, after everything but the
// record of a create is made.
type insertFails struct{ *store.Store }

func (insertFails) Insert(context.Context, *store.Sandbox) error { return errors.New("disk full") }

// TestCreateFailingLateLeavesNothing: a create that fails at its last
// step (the store's record) takes back everything its steps made: the
// backend sandbox, its fence, its gateway state and its unit of
// admission.
func TestCreateFailingLateLeavesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(o *Options) { o.Store = insertFails{o.Store.(*store.Store)} })
		ctx := t.Context()
		if _, err := e.m.Create(ctx, CreateRequest{TemplateID: "base"}); err == nil {
			t.Fatal("Create() with a failing store succeeded")
		}
		synctest.Wait()
		if ids := e.host.Running(); len(ids) != 0 {
			t.Errorf("backend sandboxes left running: %v", ids)
		}
		// Drop forgets a sandbox's gateway state with its fence.
		if n := e.m.fences.Len(); n != 0 {
			t.Errorf("%d fences left", n)
		}
		if n := e.m.CreatesInFlight(); n != 0 {
			t.Errorf("CreatesInFlight() = %d after the failed create, want 0", n)
		}
		e.m.Shutdown(ctx)
		e.store.Close()
	})
}

// lookupRunning is Live of a running sandbox alone, as the traffic proxy
// reads it: false for unknown, killed and paused sandboxes.
func lookupRunning(m *Manager, id string) (isolation.Sandbox, *Sandbox, bool) {
	info, box, err := m.Live(id)
	if err != nil || info.State != StateRunning {
		return nil, nil, false
	}
	return box, info, true
}
