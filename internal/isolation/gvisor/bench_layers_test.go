package gvisor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/testutil"
)

// holdPy holds 100 MiB of random bytes (committed pages) in a python3
// process's memory and marks /tmp/held once it does.
const holdPy = `import os,time; b=os.urandom(100<<20); open("/tmp/held","w").close(); time.sleep(1e9)`

// TestBenchGvisorMemoryLayers measures (and reports; it asserts nothing
// about time) snapshots and forks with memory on gvisor, with ~100 MiB in
// use in the sandbox: a snapshot (Checkpoint), one sandbox booted on it
// (CreateOn: restore, fresh network, agent answering), a fork of 10
// (Checkpoint then 10 CreateOn, 4 at a time as the manager does, and all
// 10 at once), next to `runsc checkpoint --leave-running` and `runsc
// restore` of the same workload directly. FENCE_BENCH=1 runs it:
//
//	FENCE_BENCH=1 go test -run TestBenchGvisorMemoryLayers -v ./internal/isolation/gvisor/
func TestBenchGvisorMemoryLayers(t *testing.T) {
	if os.Getenv("FENCE_BENCH") != "1" {
		t.Skip("set FENCE_BENCH=1 to run the gvisor benchmark")
	}
	runsc := testutil.RequireRunsc(t)
	rootfs := testutil.RootFS(t, "base")
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("load before: %s", strings.TrimSpace(string(load)))
	gv := newBackendIn(t, filepath.Join(testutil.StateDir(t), "state"))
	ctx := t.Context()
	s, err := gv.Create(ctx, isolation.Spec{RootFS: rootfs, Limits: isolation.Limits{MemoryBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Kill(context.WithoutCancel(ctx))
	if out, code, err := isolationtest.Exec(ctx, s, "sh", "-c", `(python3 -c '`+holdPy+`' </dev/null >/dev/null 2>&1 &); `+
		`for i in $(seq 600); do test -e /tmp/held && exit 0; sleep 0.1; done; exit 1`); err != nil || code != 0 {
		t.Fatalf("holding memory: %q %d %v", out, code, err)
	}
	cp := s.(isolation.Checkpointer)
	n := 3
	var snaps []time.Duration
	var layer isolation.LayerInfo
	for range n {
		t0 := time.Now()
		if layer, err = cp.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, time.Since(t0))
	}
	t.Logf("image: %d MiB", layer.Bytes>>20)
	t.Logf("gvisor snapshot (Checkpoint, --leave-running): median %v over %d (sandbox stopped %v)", median(snaps), n, layer.Took)
	var boots []time.Duration
	for range n {
		t0 := time.Now()
		f, err := gv.CreateOn(ctx, isolation.Spec{RootFS: rootfs, Limits: isolation.Limits{MemoryBytes: 1 << 30}}, layer.ID)
		if err != nil {
			t.Fatal(err)
		}
		boots = append(boots, time.Since(t0))
		f.Kill(ctx)
	}
	t.Logf("gvisor CreateOn (restore + network + agent): median %v over %d", median(boots), n)

	fork := func(par int) time.Duration {
		t0 := time.Now()
		l, err := cp.Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		boxes := make([]isolation.Sandbox, 10)
		sem := make(chan struct{}, par)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var ferr error
		for i := range boxes {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				b, err := gv.CreateOn(ctx, isolation.Spec{RootFS: rootfs, Limits: isolation.Limits{MemoryBytes: 1 << 30}}, l.ID)
				mu.Lock()
				boxes[i], ferr = b, cmpErr(ferr, err)
				mu.Unlock()
			})
		}
		wg.Wait()
		d := time.Since(t0)
		for _, b := range boxes {
			if b != nil {
				b.Kill(context.WithoutCancel(ctx))
			}
		}
		gv.DeleteLayer(ctx, l.ID)
		if ferr != nil {
			t.Fatal(ferr)
		}
		return d
	}
	t.Logf("gvisor fork of 10 (checkpoint + 10 restores, 4 at a time): %v", fork(4))
	t.Logf("gvisor fork of 10 (checkpoint + 10 restores, 10 at a time): %v", fork(10))

	// runsc directly: the same workload, no network, no agent.
	root := t.TempDir()
	t.Cleanup(func() { cleanupRunscRoot(root) })
	bundle := t.TempDir()
	writeBundle(t, bundle, rootfs, []string{"/usr/bin/python3", "-c", holdPy})
	if err := runscCmd(runsc, root, "run", "--detach", "--bundle", bundle, "hold"); err != nil {
		t.Fatal(err)
	}
	defer runscCmd(runsc, root, "delete", "--force", "hold")
	time.Sleep(3 * time.Second) // python's urandom of 100 MiB
	var cps, rss []time.Duration
	var img string
	for k := range n {
		img = filepath.Join(t.TempDir(), fmt.Sprint(k))
		t0 := time.Now()
		if err := runscCmd(runsc, root, "checkpoint", "--leave-running", "--image-path", img, "hold"); err != nil {
			t.Fatal(err)
		}
		cps = append(cps, time.Since(t0))
	}
	for k := range n {
		id := fmt.Sprintf("r%d", k)
		t0 := time.Now()
		if err := runscCmd(runsc, root, "restore", "--detach", "--bundle", bundle, "--image-path", img, id); err != nil {
			t.Fatal(err)
		}
		rss = append(rss, time.Since(t0))
		runscCmd(runsc, root, "delete", "--force", id)
	}
	var bgs []time.Duration
	for k := range n {
		id := fmt.Sprintf("bg%d", k)
		t0 := time.Now()
		if err := runscCmd(runsc, root, "restore", "--detach", "--background", "--bundle", bundle, "--image-path", img, id); err != nil {
			t.Fatal(err)
		}
		bgs = append(bgs, time.Since(t0))
		runscCmd(runsc, root, "delete", "--force", id)
	}
	t.Logf("runsc checkpoint --leave-running (direct): median %v over %d", median(cps), n)
	t.Logf("runsc restore --background under a new ID (direct): median %v over %d", median(bgs), n)
	t.Logf("runsc restore under a new ID (direct): median %v over %d", median(rss), n)
	load, _ = os.ReadFile("/proc/loadavg")
	t.Logf("load after: %s", strings.TrimSpace(string(load)))
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// cleanupRunscRoot drops what direct runsc runs on root leave behind: the
// null network namespace it pins and the bench's cgroups.
func cleanupRunscRoot(root string) {
	for unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH) == nil {
	}
	for _, d := range must(filepath.Glob("/sys/fs/cgroup/*/fence/benchrunsc/*")) {
		unix.Rmdir(d)
	}
	for _, d := range must(filepath.Glob("/sys/fs/cgroup/*/fence/benchrunsc")) {
		unix.Rmdir(d)
	}
}
