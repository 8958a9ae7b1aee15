package timetravel

import (
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/sandbox"
)

// nextStandby waits for the layerBackend's next standby boot (the
// timeout only stops a hung test).
func nextStandby(t *testing.T, e *env) *standbyBox {
	t.Helper()
	select {
	case sb := <-e.lb.standbys:
		return sb
	case <-time.After(time.Minute):
		t.Fatal("no standby booted")
		return nil
	}
}

// gone waits until sb is killed (the timeout only stops a hung test).
func gone(t *testing.T, sb *standbyBox, why string) {
	t.Helper()
	select {
	case <-sb.Done():
	case <-time.After(time.Minute):
		t.Fatalf("the standby of %s is alive after %s", sb.ID(), why)
	}
}

// TestStandbyGoesWithItsSandbox: the Keeper boots a standby of a
// sandbox on its checkpoint and kills it when the sandbox is paused or
// killed (the Manager tells it, sandbox.LayerKeeper.Release), and when
// the Keeper closes; the layer collector keeps a standby's layer while
// the standby lives.
func TestStandbyGoesWithItsSandbox(t *testing.T) {
	e := newEnv(t)
	e.lb.bootsStandbys.Store(true)
	ctx := t.Context()

	a := e.mustCreate(t, sandbox.CreateRequest{})
	cp, err := e.k.CreateCheckpoint(ctx, a.ID, "one", false)
	if err != nil {
		t.Fatalf("CreateCheckpoint(%s) = %v", a.ID, err)
	}
	sb := nextStandby(t, e)
	if sb.ID() != a.ID {
		t.Fatalf("standby booted for %s, want %s", sb.ID(), a.ID)
	}
	// The standby's layer is the checkpoint's: with the record gone, the
	// standby keeps it.
	cps, err := e.store.Checkpoints(ctx, a.ID)
	if err != nil || len(cps) != 1 {
		t.Fatalf("Checkpoints(%s) = %v, %v", a.ID, cps, err)
	}
	if err := e.store.DeleteCheckpoints(ctx, a.ID, cp.ID); err != nil {
		t.Fatal(err)
	}
	if err := collect(ctx, e.k); err != nil {
		t.Fatalf("gc = %v", err)
	}
	if !e.lb.has(cps[0].Layer) {
		t.Errorf("gc deleted the layer of a live standby")
	}
	if err := e.m.Kill(ctx, a.ID); err != nil {
		t.Fatalf("Kill(%s) = %v", a.ID, err)
	}
	gone(t, sb, "its sandbox's kill")

	b := e.mustCreate(t, sandbox.CreateRequest{})
	if _, err := e.k.CreateCheckpoint(ctx, b.ID, "", false); err != nil {
		t.Fatalf("CreateCheckpoint(%s) = %v", b.ID, err)
	}
	sb = nextStandby(t, e)
	if err := e.m.Pauses().Pause(ctx, b.ID, sandbox.WithMemory); err != nil {
		t.Fatalf("Pause(%s) = %v", b.ID, err)
	}
	gone(t, sb, "its sandbox's pause")

	c := e.mustCreate(t, sandbox.CreateRequest{})
	if _, err := e.k.CreateCheckpoint(ctx, c.ID, "", false); err != nil {
		t.Fatalf("CreateCheckpoint(%s) = %v", c.ID, err)
	}
	sb = nextStandby(t, e)
	e.k.Close()
	gone(t, sb, "the Keeper's Close")
}
