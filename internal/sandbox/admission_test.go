package sandbox

import (
	"errors"
	"testing"
	"testing/synctest"

	"github.com/fencesandbox/fence/api"
)

// TestAdmissionUnits walks one admission through every kind of unit it
// counts, without a Manager: each unit holds its place under the cap
// until it is given back, and nothing is admitted before start or after
// close.
func TestAdmissionUnits(t *testing.T) {
	ctx := t.Context()
	a := newAdmission(2, nil, nil)
	if err := a.reserve(ctx); !errors.Is(err, errNotStarted) {
		t.Fatalf("reserve() before start = %v, want errNotStarted", err)
	}
	a.start()
	full := func(step string) {
		t.Helper()
		if err := a.reserve(ctx); !errors.Is(err, api.ErrResourceExhausted) {
			t.Fatalf("%s: reserve() = %v, want ErrResourceExhausted", step, err)
		}
		if (PoolBudget{a}).TryAcquire() {
			t.Fatalf("%s: TryAcquire() = true, want false", step)
		}
	}
	for range 2 {
		if err := a.reserve(ctx); err != nil {
			t.Fatalf("reserve() = %v", err)
		}
	}
	full("two creates in flight")
	if got := a.inFlight(); got != 2 {
		t.Errorf("inFlight() = %d, want 2", got)
	}
	a.cancel()   // one create failed
	a.register() // the other is live
	if got := a.inFlight(); got != 0 {
		t.Errorf("inFlight() = %d, want 0", got)
	}
	if !(PoolBudget{a}).TryAcquire() {
		t.Fatal("TryAcquire() beside one live sandbox = false, want true")
	}
	full("one live, one pooled")
	PoolBudget{a}.Release()
	a.adopt()
	full("two live")
	a.remove()
	full("one live, one dying")
	a.released()
	if err := a.reserve(ctx); err != nil {
		t.Fatalf("reserve() once the dying one is released = %v", err)
	}
	a.cancel()
	a.close()
	if err := a.reserve(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("reserve() after close = %v, want ErrClosed", err)
	}
	if (PoolBudget{a}).TryAcquire() {
		t.Error("TryAcquire() after close = true, want false")
	}
}

// TestAdmissionFollowsTheRegistry: whichever way a sandbox leaves (a
// kill, the death of its agent, a failed create), its unit comes back,
// and a paused one keeps its unit.
func TestAdmissionFollowsTheRegistry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(o *Options) { o.MaxSandboxes = 3 })
		ctx := t.Context()
		a := e.mustCreate(t, CreateRequest{})
		b := e.mustCreate(t, CreateRequest{})
		c := e.mustCreate(t, CreateRequest{})
		if err := e.m.Pauses().Pause(ctx, c.ID, WithMemory); err != nil {
			t.Fatal(err)
		}
		if err := e.m.Kill(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		e.fakeSandbox(t, b.ID).Crash()
		synctest.Wait()
		if _, err := e.m.Create(ctx, CreateRequest{TemplateID: "nope"}); err == nil {
			t.Fatal("Create(unknown template) succeeded")
		}
		e.m.mu.Lock()
		running := len(e.m.running)
		e.m.mu.Unlock()
		e.m.adm.mu.Lock()
		live, used := e.m.adm.live, e.m.adm.usedLocked()
		e.m.adm.mu.Unlock()
		if live != running || used != 1 {
			t.Errorf("admission counts %d live, %d used; the registry holds %d (want 1 and 1)", live, used, running)
		}
		e.mustCreate(t, CreateRequest{})
		e.mustCreate(t, CreateRequest{})
		if _, err := e.m.Create(ctx, CreateRequest{TemplateID: "base"}); !errors.Is(err, api.ErrResourceExhausted) {
			t.Errorf("Create() beyond the cap = %v, want ErrResourceExhausted", err)
		}
		e.m.Shutdown(ctx)
		e.store.Close()
	})
}
