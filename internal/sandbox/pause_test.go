package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/store"
)

func (e *env) fakeSandbox(t *testing.T, id string) *fake.Sandbox {
	t.Helper()
	fs, ok := e.host.Sandbox(id)
	if !ok {
		t.Fatalf("sandbox %s is not on the fake host", id)
	}
	return fs
}

func TestPauseResume(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	e := newEnv(t, func(o *Options) { o.Now = clk.Now })
	ctx := t.Context()
	t0 := clk.Now()
	s := e.mustCreate(t, CreateRequest{Timeout: time.Minute})
	clk.Advance(time.Second)
	other := e.mustCreate(t, CreateRequest{})
	clk.Advance(10 * time.Second)
	if err := e.m.Pauses().Pause(ctx, s.ID, WithMemory); err != nil {
		t.Fatalf("Pause() = %v", err)
	}
	pausedAt := clk.Now()
	if p, _ := e.fakeSandbox(t, s.ID).Paused(); !p {
		t.Errorf("backend sandbox not paused")
	}
	got, err := e.m.Get(ctx, s.ID)
	if err != nil || got.State != StatePaused || !got.StartedAt.Equal(t0) || !got.EndAt.Equal(pausedAt) {
		t.Fatalf("Get(paused) = %+v, %v; want paused, started %v, endAt the pause time %v", got, err, t0, pausedAt)
	}
	rec, _ := e.store.Get(ctx, s.ID)
	if rec.State != store.StatePaused || !rec.EndAt.Equal(pausedAt) || rec.EnvdAccessToken != s.EnvdAccessToken {
		t.Errorf("record of the paused sandbox = %+v", rec)
	}
	if _, _, ok := lookupRunning(e.m, s.ID); ok {
		t.Errorf("lookupRunning(paused) = true, want false (no traffic to a paused sandbox)")
	}
	// A signed URL still names it (the proxy then answers for a paused
	// sandbox).
	if id, ok := e.m.MatchToken(func(tok string) bool { return tok == s.EnvdAccessToken }); !ok || id != s.ID {
		t.Errorf("MatchToken(paused's token) = %q, %v; want %s", id, ok, s.ID)
	}
	if err := e.m.Pauses().Pause(ctx, s.ID, WithMemory); !errors.Is(err, api.ErrConflict) {
		t.Errorf("Pause(paused) = %v, want ErrConflict", err)
	}
	if _, err := e.m.Pauses().Resume(ctx, other.ID, time.Minute, nil, WithMemory); !errors.Is(err, api.ErrConflict) {
		t.Errorf("Resume(running) = %v, want ErrConflict", err)
	}
	for _, id := range []string{"unknown", "Bad/ID"} {
		if err := e.m.Pauses().Pause(ctx, id, WithMemory); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("Pause(%q) = %v, want ErrNotFound", id, err)
		}
		if _, err := e.m.Pauses().Resume(ctx, id, time.Minute, nil, WithMemory); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("Resume(%q) = %v, want ErrNotFound", id, err)
		}
	}
	if err := e.m.SetTimeout(ctx, s.ID, time.Hour); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("SetTimeout(paused) = %v, want ErrNotFound", err)
	}
	for _, tc := range []struct {
		states []State
		want   []string
	}{
		{[]State{StatePaused}, []string{s.ID}},
		{[]State{StateRunning}, []string{other.ID}},
		{nil, []string{s.ID, other.ID}},
	} {
		l, err := e.m.List(ctx, ListFilter{States: tc.states, Ascending: true})
		var ids []string
		for _, x := range l {
			ids = append(ids, x.ID)
			if x.ID == s.ID && (x.State != StatePaused || !x.EndAt.Equal(pausedAt)) {
				t.Errorf("listed paused sandbox = %+v", x)
			}
		}
		if err != nil || len(ids) != len(tc.want) || (len(ids) > 0 && ids[0] != tc.want[0]) {
			t.Errorf("List(%v) = %v, %v; want %v", tc.states, ids, err, tc.want)
		}
	}
	// The timeout clock stops while paused: hours later it is still there.
	clk.Advance(2 * time.Hour)
	e.m.reap(ctx)
	if _, err := e.m.Get(ctx, s.ID); err != nil {
		t.Fatalf("Get(paused past its old deadline) = %v", err)
	}
	if _, err := e.m.Pauses().Resume(ctx, s.ID, 25*time.Hour, nil, WithMemory); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("Resume(25h) = %v, want ErrInvalidArgument", err)
	}
	r, err := e.m.Pauses().Resume(ctx, s.ID, 15*time.Second, nil, WithMemory)
	if err != nil {
		t.Fatalf("Resume() = %v", err)
	}
	now := clk.Now()
	if r.State != StateRunning || !r.StartedAt.Equal(now) || !r.EndAt.Equal(now.Add(15*time.Second)) ||
		r.EnvdAccessToken != s.EnvdAccessToken {
		t.Errorf("Resume() = %+v; want running, started now, ending in 15s, same token", r)
	}
	if p, n := e.fakeSandbox(t, s.ID).Paused(); p || n != 1 {
		t.Errorf("backend sandbox paused=%v after %d pauses, want running", p, n)
	}
	if _, _, ok := lookupRunning(e.m, s.ID); !ok {
		t.Errorf("lookupRunning(resumed) = false")
	}
	rec, _ = e.store.Get(ctx, s.ID)
	if rec.State != store.StateRunning || !rec.CreatedAt.Equal(now) || !rec.EndAt.Equal(now.Add(15*time.Second)) {
		t.Errorf("record of the resumed sandbox = %+v", rec)
	}
	// A new run has a deadline again.
	clk.Advance(time.Minute)
	e.m.reap(ctx)
	if _, err := e.m.Get(ctx, s.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get(resumed, past its new deadline) = %v, want ErrNotFound", err)
	}
}

func TestPauseCutsTraffic(t *testing.T) {
	e := newEnv(t)
	s := e.mustCreate(t, CreateRequest{})
	_, info, ok := lookupRunning(e.m, s.ID)
	if !ok || info.RunDone == nil {
		t.Fatalf("lookupRunning() = %+v, %v", info, ok)
	}
	if err := e.m.Pauses().Pause(t.Context(), s.ID, WithMemory); err != nil {
		t.Fatal(err)
	}
	select {
	case <-info.RunDone:
	default:
		t.Errorf("RunDone not closed by the pause")
	}
	if _, err := e.m.Pauses().Resume(t.Context(), s.ID, time.Minute, nil, WithMemory); err != nil {
		t.Fatal(err)
	}
	_, info2, _ := lookupRunning(e.m, s.ID)
	select {
	case <-info2.RunDone:
		t.Errorf("RunDone of the new run is closed")
	default:
	}
}

func TestConnect(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	e := newEnv(t, func(o *Options) { o.Now = clk.Now })
	ctx := t.Context()
	s := e.mustCreate(t, CreateRequest{Timeout: 5 * time.Minute})
	// Running: never shortened, and no resume.
	got, resumed, err := e.m.Pauses().Connect(ctx, s.ID, 10*time.Second, WithMemory)
	if err != nil || resumed || !got.EndAt.Equal(s.EndAt) {
		t.Errorf("Connect(running, 10s) = %+v, %v, %v; want EndAt unchanged, not resumed", got, resumed, err)
	}
	if err := e.m.Pauses().Pause(ctx, s.ID, WithMemory); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	got, resumed, err = e.m.Pauses().Connect(ctx, s.ID, 10*time.Second, WithMemory)
	if err != nil || !resumed || got.State != StateRunning || !got.EndAt.Equal(clk.Now().Add(10*time.Second)) {
		t.Errorf("Connect(paused, 10s) = %+v, %v, %v; want resumed, ending in 10s", got, resumed, err)
	}
	if _, _, err := e.m.Pauses().Connect(ctx, "unknown", time.Minute, WithMemory); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Connect(unknown) = %v, want ErrNotFound", err)
	}
	if err := e.m.Kill(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.m.Pauses().Connect(ctx, s.ID, time.Minute, WithMemory); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Connect(killed) = %v, want ErrNotFound", err)
	}
}

func TestAutoPauseAndWake(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	e := newEnv(t, func(o *Options) { o.Now = clk.Now })
	ctx := t.Context()
	ap := e.mustCreate(t, CreateRequest{Timeout: time.Minute, AutoPause: true})
	aw := e.mustCreate(t, CreateRequest{Timeout: 2 * time.Minute, AutoPause: true, AutoResume: true})
	plain := e.mustCreate(t, CreateRequest{Timeout: time.Minute})
	clk.Advance(3 * time.Minute)
	e.m.reap(ctx)
	for _, id := range []string{ap.ID, aw.ID} {
		got, err := e.m.Get(ctx, id)
		if err != nil || got.State != StatePaused {
			t.Errorf("Get(%s) after its deadline with AutoPause = %+v, %v; want paused", id, got, err)
		}
	}
	if _, err := e.m.Get(ctx, plain.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get(expired, no AutoPause) = %v, want ErrNotFound", err)
	}
	// Traffic wakes only the one with AutoResume, with its create timeout.
	if e.m.Pauses().WakeOnTraffic(ctx, ap.ID) {
		t.Errorf("WakeOnTraffic(no AutoResume) = true")
	}
	if got, _ := e.m.Get(ctx, ap.ID); got.State != StatePaused {
		t.Errorf("sandbox without AutoResume woke: %+v", got)
	}
	if !e.m.Pauses().WakeOnTraffic(ctx, aw.ID) {
		t.Fatalf("WakeOnTraffic(AutoResume) = false")
	}
	got, _ := e.m.Get(ctx, aw.ID)
	if got.State != StateRunning || !got.EndAt.Equal(clk.Now().Add(2*time.Minute)) {
		t.Errorf("woken sandbox = %+v; want running, ending in its create timeout (2m)", got)
	}
	if !e.m.Pauses().WakeOnTraffic(ctx, aw.ID) {
		t.Errorf("WakeOnTraffic(running) = false, want true (it runs)")
	}
	if e.m.Pauses().WakeOnTraffic(ctx, "unknown") {
		t.Errorf("WakeOnTraffic(unknown) = true")
	}
}

func TestKillPaused(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	s := e.mustCreate(t, CreateRequest{})
	if err := e.m.Pauses().Pause(ctx, s.ID, WithMemory); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Kill(ctx, s.ID); err != nil {
		t.Fatalf("Kill(paused) = %v", err)
	}
	if got := e.host.Running(); len(got) != 0 {
		t.Errorf("host runs %v after killing the paused sandbox", got)
	}
	rec, _ := e.store.Get(ctx, s.ID)
	if rec.State != store.StateKilled || rec.EnvdAccessToken != "" {
		t.Errorf("record = %+v, want killed without token", rec)
	}
	if _, err := e.m.Pauses().Resume(ctx, s.ID, time.Minute, nil, WithMemory); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Resume(killed) = %v, want ErrNotFound", err)
	}
}

func TestPausedCountsAgainstMax(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxSandboxes = 1 })
	s := e.mustCreate(t, CreateRequest{})
	if err := e.m.Pauses().Pause(t.Context(), s.ID, WithMemory); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(t.Context(), CreateRequest{TemplateID: "base"}); !errors.Is(err, api.ErrResourceExhausted) {
		t.Errorf("Create() with a paused sandbox at the cap = %v, want ErrResourceExhausted", err)
	}
	if n, p := e.m.Counts(); n != 0 || p != 1 {
		t.Errorf("Running(), Paused() = %d, %d with one paused sandbox, want 0, 1", n, p)
	}
}

func TestPausedDoesNotSurviveRestart(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "fence.db"))
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
	// m1 "crashes" below; its goroutines still stop before the store and
	// its directory go.
	defer m1.Shutdown(context.Background())
	s, err := m1.Create(ctx, CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m1.Pauses().Pause(ctx, s.ID, WithMemory); err != nil {
		t.Fatal(err)
	}
	// m1 "crashes" with the sandbox paused.
	opts.Backend = fake.New(fake.Options{Host: host})
	m2, _ := New(opts)
	if err := m2.Start(ctx); err != nil {
		t.Fatalf("Start() = %v", err)
	}
	defer m2.Shutdown(context.Background())
	rec, err := st.Get(ctx, s.ID)
	if err != nil || rec.State != store.StateKilled {
		t.Errorf("record of the paused sandbox after a restart = %+v, %v; want killed", rec, err)
	}
	if got := host.Running(); len(got) != 0 {
		t.Errorf("host after restart runs %v", got)
	}
	l, _ := m2.List(ctx, ListFilter{States: []State{StatePaused}})
	if len(l) != 0 {
		t.Errorf("List(paused) after restart = %d sandboxes, want none", len(l))
	}
	if _, _, err := m2.Pauses().Connect(ctx, s.ID, time.Minute, WithMemory); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Connect() after restart = %v, want ErrNotFound", err)
	}
}
