package native_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestLayerStoresBench measures, on the copy store and the btrfs store in
// one run, a checkpoint of a sandbox that changed 1,000 files and wrote
// 100 MB, listing its entries (what a diff reads), a rewind (the old
// sandbox killed, a new one under its ID booted on the checkpoint) with
// its phases, and a fork of 10. It reports; it asserts no time.
//
//	FENCE_BENCH_LAYERS=1 go test -count=1 -v -run TestLayerStoresBench ./internal/isolation/native/
func TestLayerStoresBench(t *testing.T) {
	if os.Getenv("FENCE_BENCH_LAYERS") == "" {
		t.Skip("set FENCE_BENCH_LAYERS=1 to run the layer store benchmark")
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		t.Logf("load average: %s", la)
	}
	forStores(t, func(t *testing.T, opts native.Options) {
		b := newBackendWith(t, opts)
		src := create(t, b, isolation.Spec{})
		write := func() {
			sh(t, src, `mkdir -p /w && cd /w && i=0; while [ $i -lt 1000 ]; do echo "$i $$ $(date +%N)" > f$i; i=$((i+1)); done
				head -c 100000000 /dev/urandom > /big`)
		}
		cp := src.(isolation.Checkpointer)
		var last isolation.LayerInfo
		for i := range 3 {
			write()
			start := time.Now()
			info, err := cp.Checkpoint(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			wall := time.Since(start)
			start = time.Now()
			ch, err := b.LayerChanges(t.Context(), info.ID)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("checkpoint %d (1,000 files and 100 MB rewritten): %v (sandbox frozen %v); listing its %d changes (diff): %v",
				i+1, wall.Round(time.Microsecond), info.Took.Round(time.Microsecond), len(ch), time.Since(start).Round(time.Millisecond))
			last = info
		}
		start := time.Now()
		again, err := cp.Checkpoint(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("checkpoint with nothing changed: %v (frozen %v)", time.Since(start).Round(time.Microsecond), again.Took.Round(time.Microsecond))

		// Rewind, as the manager does it: kill, then boot under the same ID.
		box := createOn(t, b, last.ID)
		for i := range 3 {
			t0 := time.Now()
			if err := box.Kill(t.Context()); err != nil {
				t.Fatal(err)
			}
			t1 := time.Now()
			nb, err := b.CreateOn(t.Context(), isolation.Spec{ID: box.ID(), RootFS: rootFS(t)}, last.ID)
			if err != nil {
				t.Fatal(err)
			}
			t2 := time.Now()
			t.Cleanup(func() { nb.Kill(context.Background()) })
			sh(t, nb, `test -e /w/f999`)
			t.Logf("rewind %d: %v (kill %v, boot under the same ID %v)", i+1, t2.Sub(t0).Round(time.Millisecond),
				t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond))
			box = nb
		}
		start = time.Now()
		fresh := createOn(t, b, last.ID)
		t.Logf("boot on the layer under a new ID: %v", time.Since(start).Round(time.Millisecond))
		_ = fresh

		// Fork of 10: a checkpoint, then 10 boots on it, 4 at a time.
		start = time.Now()
		info, err := cp.Checkpoint(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		sem := make(chan struct{}, 4)
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				f, err := b.CreateOn(context.Background(), isolation.Spec{RootFS: rootFS(t)}, info.ID)
				if err != nil {
					t.Error(err)
					return
				}
				t.Cleanup(func() { f.Kill(context.Background()) })
			})
		}
		wg.Wait()
		t.Logf("fork of 10: %v", time.Since(start).Round(time.Millisecond))
	})
}

func rootFS(t *testing.T) string { return testutil.RootFS(t, "minimal") }
