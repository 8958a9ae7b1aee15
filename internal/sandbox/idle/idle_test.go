package idle

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeCore is a manager with one running sandbox whose CPU counter the
// test sets; Pause records the pauses quiet allowed.
type fakeCore struct {
	mu     sync.Mutex
	cpu    time.Duration
	paused atomic.Int32
	cands  []Candidate
}

func (c *fakeCore) Candidates() []Candidate { return c.cands }

func (c *fakeCore) Pause(_ context.Context, _ string, quiet func() bool) error {
	if !quiet() {
		return ErrNotQuiet
	}
	c.paused.Add(1)
	return nil
}

func (c *fakeCore) read(context.Context) (time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cpu, nil
}

// clock is a test clock moved by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func setup() (*Tracker, *fakeCore, *clock) {
	clk := &clock{t: time.Unix(1_000_000, 0)}
	core := &fakeCore{}
	core.cands = []Candidate{{ID: "sb", Timeout: 10 * time.Second, Since: clk.now(), Incarnation: 1, CPU: core.read}}
	tr := New(Options{Now: clk.now})
	tr.Bind(core)
	return tr, core, clk
}

func TestIdleSandboxIsPaused(t *testing.T) {
	tr, core, clk := setup()
	ctx := context.Background()
	tr.Check(ctx)
	clk.add(9 * time.Second)
	tr.Check(ctx)
	if core.paused.Load() != 0 {
		t.Fatal("paused before its idle timeout")
	}
	clk.add(2 * time.Second)
	tr.Check(ctx)
	if core.paused.Load() != 1 {
		t.Fatal("not paused after its idle timeout")
	}
}

func TestUseKeepsSandboxRunning(t *testing.T) {
	ctx := context.Background()
	t.Run("touch", func(t *testing.T) {
		tr, core, clk := setup()
		for range 5 {
			clk.add(6 * time.Second)
			tr.Touch("sb")
			tr.Check(ctx)
		}
		if core.paused.Load() != 0 {
			t.Fatal("a sandbox touched every 6 s was paused with a 10 s idle timeout")
		}
	})
	t.Run("request in flight", func(t *testing.T) {
		tr, core, clk := setup()
		end := tr.Begin("sb")
		for range 5 {
			clk.add(6 * time.Second)
			tr.Check(ctx)
		}
		if core.paused.Load() != 0 {
			t.Fatal("a sandbox with a request in flight was paused")
		}
		end()
		end() // idempotent
		clk.add(11 * time.Second)
		tr.Check(ctx)
		if core.paused.Load() != 1 {
			t.Fatal("not paused once its request ended and the timeout passed")
		}
	})
	t.Run("cpu", func(t *testing.T) {
		tr, core, clk := setup()
		tr.Check(ctx)
		for range 5 {
			clk.add(6 * time.Second)
			core.mu.Lock()
			core.cpu += time.Second // 1/6 of a CPU
			core.mu.Unlock()
			tr.Check(ctx)
		}
		if core.paused.Load() != 0 {
			t.Fatal("a sandbox using 1/6 of a CPU was paused")
		}
		for range 2 {
			clk.add(6 * time.Second)
			core.mu.Lock()
			core.cpu += time.Millisecond // below the threshold
			core.mu.Unlock()
			tr.Check(ctx)
		}
		if core.paused.Load() != 1 {
			t.Fatal("a sandbox using almost no CPU was not paused")
		}
	})
}

func TestRecordsOfGoneSandboxesAreDropped(t *testing.T) {
	tr, core, _ := setup()
	tr.Touch("other")
	tr.Check(context.Background())
	if _, ok := tr.acts.Load("other"); ok {
		t.Fatal("the record of a sandbox that is no candidate was kept")
	}
	core.cands = nil
	tr.Check(context.Background())
	if _, ok := tr.acts.Load("sb"); ok {
		t.Fatal("the record of a sandbox no longer a candidate was kept")
	}
}
