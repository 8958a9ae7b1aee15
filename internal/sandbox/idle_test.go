package sandbox

import (
	"errors"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/sandbox/idle"
)

// TestIdlePauseDeadlines: a sandbox idle past its idle timeout is paused
// with its memory, and its resume gives back what its deadline had left
// (traffic), or the longer of that and the timeout asked (connect); a
// pause by its owner keeps E2B's semantics (no resume on traffic without
// autoResume, connect gives now+timeout).
func TestIdlePauseDeadlines(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	tr := idle.New(idle.Options{Every: time.Hour, Now: clk.Now}) // checked by hand
	e := newEnv(t, func(o *Options) { o.Now = clk.Now; o.Idle = tr })
	ctx := t.Context()
	idleFor := 10 * time.Second
	s := e.mustCreate(t, CreateRequest{Timeout: time.Hour, IdleTimeout: &idleFor})
	never := e.mustCreate(t, CreateRequest{Timeout: time.Hour})
	get := func(id string) *Sandbox {
		t.Helper()
		got, err := e.m.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// idleOut lets the sandbox idle past its timeout and checks it was
	// paused; it returns what its deadline had left.
	idleOut := func() time.Duration {
		t.Helper()
		before := get(s.ID)
		tr.Check(ctx)
		clk.Advance(idleFor - time.Second)
		tr.Check(ctx)
		if got := get(s.ID); got.State != StateRunning {
			t.Fatalf("paused before its idle timeout: %+v", got)
		}
		clk.Advance(2 * time.Second)
		tr.Check(ctx)
		got := get(s.ID)
		if got.State != StatePaused || !got.EndAt.Equal(clk.Now()) {
			t.Fatalf("after its idle timeout: %+v; want paused at %v", got, clk.Now())
		}
		if p, _ := e.fakeSandbox(t, s.ID).Paused(); !p {
			t.Fatal("the backend sandbox was not paused (with its memory)")
		}
		return before.EndAt.Sub(clk.Now())
	}

	left := idleOut()
	if got := get(never.ID); got.State != StateRunning {
		t.Errorf("a sandbox without an idle timeout was paused: %+v", got)
	}
	clk.Advance(time.Minute)
	if !e.m.Pauses().WakeOnTraffic(ctx, s.ID) {
		t.Fatal("traffic did not resume a sandbox paused for idleness")
	}
	if got := get(s.ID); got.State != StateRunning || !got.EndAt.Equal(clk.Now().Add(left)) {
		t.Fatalf("after traffic: %+v; want running until now + %v", got, left)
	}

	left = idleOut()
	clk.Advance(time.Minute)
	if _, resumed, err := e.m.Pauses().Connect(ctx, s.ID, time.Minute, WithMemory); err != nil || !resumed {
		t.Fatalf("Connect = %v, %v", resumed, err)
	}
	if got := get(s.ID); !got.EndAt.Equal(clk.Now().Add(left)) {
		t.Fatalf("after connect with 1m: endAt %v, want now + what was left (%v)", got.EndAt, left)
	}

	idleOut()
	if _, _, err := e.m.Pauses().Connect(ctx, s.ID, 2*time.Hour, WithMemory); err != nil {
		t.Fatal(err)
	}
	if got := get(s.ID); !got.EndAt.Equal(clk.Now().Add(2 * time.Hour)) {
		t.Fatalf("after connect with 2h: endAt %v, want now + 2h", got.EndAt)
	}

	idleOut()
	if err := e.m.SetTimeout(ctx, s.ID, 5*time.Minute); err != nil {
		t.Fatalf("SetTimeout on a sandbox paused for idleness: %v", err)
	}
	if got := get(s.ID); got.State != StateRunning || !got.EndAt.Equal(clk.Now().Add(5*time.Minute)) {
		t.Fatalf("after SetTimeout: %+v; want running until now + 5m", got)
	}

	// Paused by its owner: E2B's semantics.
	if err := e.m.Pauses().Pause(ctx, s.ID, WithMemory); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	if e.m.Pauses().WakeOnTraffic(ctx, s.ID) {
		t.Error("traffic resumed a sandbox its owner paused, without autoResume")
	}
	if _, _, err := e.m.Pauses().Connect(ctx, s.ID, time.Minute, WithMemory); err != nil {
		t.Fatal(err)
	}
	if got := get(s.ID); !got.EndAt.Equal(clk.Now().Add(time.Minute)) {
		t.Errorf("connect after an owner's pause: endAt %v, want now + 1m", got.EndAt)
	}
}

// TestIdleTimeoutValidation: out-of-range idle timeouts are refused and
// create nothing.
func TestIdleTimeoutValidation(t *testing.T) {
	e := newEnv(t)
	for _, d := range []time.Duration{-time.Second, 500 * time.Millisecond, 31 * 24 * time.Hour} {
		if _, err := e.m.Create(t.Context(), CreateRequest{TemplateID: "base", IdleTimeout: &d}); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("Create with idle timeout %v = %v, want ErrInvalidArgument", d, err)
		}
	}
	if n, _ := e.m.Counts(); n != 0 {
		t.Errorf("%d sandboxes running after refused creates", n)
	}
}

// TestIdleCandidatesAreOnlyThoseWithAnIdleTimeout: the idle tracker's
// check, every second, copies the sandboxes that have an idle timeout
// alone, not every live one under the Manager's lock; killed ones leave.
func TestIdleCandidatesAreOnlyThoseWithAnIdleTimeout(t *testing.T) {
	tr := idle.New(idle.Options{Every: time.Hour}) // checked by hand
	e := newEnv(t, func(o *Options) { o.Idle = tr })
	idleFor := time.Minute
	for range 3 {
		e.mustCreate(t, CreateRequest{Timeout: time.Hour})
	}
	s := e.mustCreate(t, CreateRequest{Timeout: time.Hour, IdleTimeout: &idleFor})
	before := candidatesCopied.Load()
	got := idleCore{e.m}.Candidates()
	if n := candidatesCopied.Load() - before; n != 1 || len(got) != 1 || got[0].ID != s.ID {
		t.Errorf("Candidates beside 3 sandboxes without an idle timeout copied %d sandboxes and gave %+v; want 1 copied, %s alone", n, got, s.ID)
	}
	if err := e.m.Kill(t.Context(), s.ID); err != nil {
		t.Fatal(err)
	}
	before = candidatesCopied.Load()
	if got := (idleCore{e.m}).Candidates(); len(got) != 0 || candidatesCopied.Load() != before {
		t.Errorf("Candidates after the kill of the only sandbox with an idle timeout = %+v, %d copied; want none", got, candidatesCopied.Load()-before)
	}
}
