package native_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
)

// TestCheckpointWatchBench measures, on the copy store, a sandbox's
// checkpoints with nothing changed and with 10 files rewritten since the
// previous one (its wall time, the time the sandbox is frozen, the CPU
// the daemon spends, and how many entries of the writable layer it
// reads), holding N files in one directory (N = 1,000, 10,000 and
// 100,000, or FENCE_BENCH_FILES), its changes found by a walk of its
// writable layer (the watcher off) and from the watcher's record,
// alternated, FENCE_BENCH_ROUNDS rounds (2); medians of 5. Then the cost
// of the watcher to a sandbox's writes: the CPU an untar of 10,000 files
// takes in the sandbox (the tar's user and system time, the kernel's
// fanotify work among it) and in the daemon (this process, which drains
// the queue), with the watcher and without, alternated. It reports; it
// asserts no time.
//
//	FENCE_BENCH_LAYERS=1 go test -count=1 -v -run TestCheckpointWatchBench ./internal/isolation/native/
func TestCheckpointWatchBench(t *testing.T) {
	if os.Getenv("FENCE_BENCH_LAYERS") == "" {
		t.Skip("set FENCE_BENCH_LAYERS=1 to run the checkpoint benchmark")
	}
	sizes := []int{1000, 10000, 100000}
	if s := os.Getenv("FENCE_BENCH_FILES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			sizes = append(sizes, n)
		}
	}
	rounds := 2
	if s := os.Getenv("FENCE_BENCH_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2].Round(time.Microsecond)
	}
	load := func() string {
		la, _ := os.ReadFile("/proc/loadavg")
		return strings.Join(strings.Fields(string(la))[:3], " ")
	}
	b := newBackendWith(t, native.Options{CopyLayers: true})
	native.NoSquash(t)
	for _, n := range sizes {
		for r := range rounds {
			for _, watch := range []bool{false, true} {
				if !watch {
					native.NoWatch(t)
				}
				src := create(t, b, isolation.Spec{})
				// Made 10,000 at a time: each command has a minute on a busy machine.
				for i := 0; i < n; i += 10000 {
					sh(t, src, fmt.Sprintf(`mkdir -p /w && cd /w && seq %d %d | sed 's/^/f/' | xargs touch`, i+1, min(i+10000, n)))
				}
				sh(t, src, `sleep 0.2`)
				cp := src.(isolation.Checkpointer)
				if _, err := cp.Checkpoint(t.Context()); err != nil {
					t.Fatal(err)
				}
				var idle, idleFrozen, idleCPU, some, someFrozen, someCPU []time.Duration
				var idleRead, someRead int64
				for i := range 5 {
					start, cpu := time.Now(), cpuNow()
					info, err := cp.Checkpoint(t.Context())
					if err != nil {
						t.Fatal(err)
					}
					idle, idleFrozen, idleCPU = append(idle, time.Since(start)), append(idleFrozen, info.Took), append(idleCPU, cpuNow()-cpu)
					idleRead = max(idleRead, native.ExaminedEntries(src))
					sh(t, src, fmt.Sprintf(`cd /w && for j in 1 2 3 4 5 6 7 8 9 10; do echo %d > f$j; done; sleep 0.1`, i))
					start, cpu = time.Now(), cpuNow()
					info, err = cp.Checkpoint(t.Context())
					if err != nil {
						t.Fatal(err)
					}
					some, someFrozen, someCPU = append(some, time.Since(start)), append(someFrozen, info.Took), append(someCPU, cpuNow()-cpu)
					someRead = max(someRead, native.ExaminedEntries(src))
				}
				how := "walk"
				if watch {
					how = "record"
					if w := native.WatchedCheckpoints(src); w != 10 {
						t.Errorf("%d of 10 checkpoints made from the record", w)
					}
				}
				t.Logf("%d files, %s, round %d (load %s): nothing changed %v (frozen %v, CPU %v, %d entries read); 10 files rewritten %v (frozen %v, CPU %v, %d entries read)",
					n, how, r+1, load(), median(idle), median(idleFrozen), median(idleCPU), idleRead,
					median(some), median(someFrozen), median(someCPU), someRead)
				src.Kill(t.Context())
				native.AllowWatch()
			}
		}
	}
	// The watcher's cost to writes.
	for r := range rounds {
		for _, watch := range []bool{false, true} {
			if !watch {
				native.NoWatch(t)
			}
			src := create(t, b, isolation.Spec{})
			sh(t, src, `mkdir -p /s/t /d && cd /s/t && seq 1 10000 | sed 's/^/f/' | xargs touch && cd /s && tar cf /s.tar t`)
			cp := src.(isolation.Checkpointer)
			if _, err := cp.Checkpoint(t.Context()); err != nil {
				t.Fatal(err)
			}
			for end := time.Now().Add(time.Minute); b.PendingReleases() > 0 && time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond) // the sandboxes killed before are released
			}
			cpu := cpuNow()
			out := sh(t, src, `cd /d && time -p tar xf /s.tar 2>&1 >/dev/null; sleep 0.2`)
			daemon := cpuNow() - cpu
			how := "without the watcher"
			if watch {
				how = "with the watcher"
			}
			t.Logf("untar of 10,000 files %s, round %d (load %s): in the sandbox %s; this process (daemon) %v",
				how, r+1, load(), strings.Join(strings.Fields(out), " "), daemon.Round(time.Microsecond))
			src.Kill(t.Context())
			native.AllowWatch()
		}
	}
}

// cpuNow is the CPU time this process (the daemon) has used.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
