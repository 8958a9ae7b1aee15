package native_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
)

// TestCheckpointSizeBench measures, on each layer store, a checkpoint of a
// sandbox that holds N changed files and 100 MB (N = 1,000 and 10,000),
// with nothing changed since its previous checkpoint and with 10 files
// rewritten, beside its peer: `cp -a` of the same files (its first
// checkpoint's tree) on the same filesystem. Medians of 5. It reports; it
// asserts no time.
//
//	FENCE_BENCH_LAYERS=1 go test -count=1 -v -run TestCheckpointSizeBench ./internal/isolation/native/
func TestCheckpointSizeBench(t *testing.T) {
	if os.Getenv("FENCE_BENCH_LAYERS") == "" {
		t.Skip("set FENCE_BENCH_LAYERS=1 to run the checkpoint benchmark")
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		t.Logf("load average: %s", la)
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	forStores(t, func(t *testing.T, opts native.Options) {
		for _, n := range []int{1000, 10000} {
			b := newBackendWith(t, opts)
			src := create(t, b, isolation.Spec{})
			sh(t, src, fmt.Sprintf(`mkdir -p /w && cd /w && i=0; while [ $i -lt %d ]; do echo "$i" > f$i; i=$((i+1)); done
				head -c 100000000 /dev/urandom > /big; sleep 0.2`, n))
			cp := src.(isolation.Checkpointer)
			first, err := cp.Checkpoint(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			var idle, idleFrozen, some, someFrozen, peer []time.Duration
			for i := range 5 {
				start := time.Now()
				info, err := cp.Checkpoint(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				idle, idleFrozen = append(idle, time.Since(start)), append(idleFrozen, info.Took)
				sh(t, src, fmt.Sprintf(`cd /w && for j in 0 1 2 3 4 5 6 7 8 9; do echo %d > f$j; done; sleep 0.1`, i))
				start = time.Now()
				info, err = cp.Checkpoint(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				some, someFrozen = append(some, time.Since(start)), append(someFrozen, info.Took)
				dst := filepath.Join(b.LayersDir(), fmt.Sprintf(".bench-cp-%d", i))
				start = time.Now()
				if out, err := exec.Command("cp", "-a", b.LayerTree(first.ID), dst).CombinedOutput(); err != nil {
					t.Fatalf("cp -a: %v: %s", err, out)
				}
				peer = append(peer, time.Since(start))
				os.RemoveAll(dst)
			}
			t.Logf("%d files + 100 MB: checkpoint, nothing changed %v (frozen %v); 10 files rewritten %v (frozen %v); cp -a of the files %v",
				n, median(idle).Round(time.Microsecond), median(idleFrozen).Round(time.Microsecond),
				median(some).Round(time.Microsecond), median(someFrozen).Round(time.Microsecond), median(peer).Round(time.Microsecond))
			src.Kill(t.Context())
		}
	})
}
