package integration

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// TestLayersBench measures pause, resume, snapshot, checkpoint, rewind
// and fork-of-10 on a sandbox with 100 MB of memory in use, 1,000 changed
// files and 100 MB written, through the Go SDK (HTTP included), on each
// layer store. Report only: it
// asserts nothing about time, and runs only with FENCE_BENCH_LAYERS=1.
//
//	FENCE_BENCH_LAYERS=1 FENCE_TEST_TEMPLATES=/var/lib/fence/templates FENCE_BIN=$PWD/bin/fence \
//	  go test -count=1 -v -run TestLayersBench ./integration/
func TestLayersBench(t *testing.T) {
	if os.Getenv("FENCE_BENCH_LAYERS") == "" {
		t.Skip("set FENCE_BENCH_LAYERS=1 to run the layers benchmark")
	}
	requireTemplate(t, "base")
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		t.Logf("load average: %s", la)
	}
	forLayerStores(t, testLayersBench)
}

func testLayersBench(t *testing.T, flags ...string) {
	d := startDaemon(t, newDataDir(t), flags...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := d.Client
	mem := int64(1024)
	sb := d.create(t, api.NewSandbox{TemplateID: "base", MemoryMB: &mem})
	e := sb.Envd()
	rsh(t, e, `mkdir -p /home/user/work && python3 -c "
import os
for i in range(1000): open('/home/user/work/f%d' % i, 'wb').write(os.urandom(4096))"
		head -c 100000000 /dev/urandom > /home/user/big`)
	rsh(t, e, `nohup python3 -c "
b = bytearray(100 << 20)
for i in range(0, len(b), 4096): b[i] = 1
import time; time.sleep(3600)" >/dev/null 2>&1 &
sleep 2`)
	const runs = 5
	measure := func(name string, fn func()) {
		var ds []time.Duration
		for range runs {
			start := time.Now()
			fn()
			ds = append(ds, time.Since(start))
		}
		report(t, name, ds)
	}
	var pauses, resumes []time.Duration
	for range runs {
		start := time.Now()
		if err := c.Pause(ctx, sb.ID()); err != nil {
			t.Fatal(err)
		}
		pauses = append(pauses, time.Since(start))
		start = time.Now()
		if _, err := c.Connect(ctx, sb.ID(), 10*time.Minute); err != nil {
			t.Fatal(err)
		}
		resumes = append(resumes, time.Since(start))
	}
	report(t, "pause (memory kept)", pauses)
	report(t, "resume (connect)", resumes)
	var frozen []float64
	var cps []string
	start := time.Now()
	first, err := c.Checkpoint(ctx, sb.ID(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%-28s %8.1f ms (frozen %.1f ms, %d entries, %d bytes)", "checkpoint, first", ms(time.Since(start)), first.FrozenMs, first.Files, first.Bytes)
	cps = append(cps, first.CheckpointID)
	rsh(t, e, `python3 -c "
import os
for i in range(100): open('/home/user/work/f%d' % i, 'wb').write(os.urandom(4096))"`)
	start = time.Now()
	again, err := c.Checkpoint(ctx, sb.ID(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%-28s %8.1f ms (frozen %.1f ms, %d bytes)", "checkpoint, 100 rewritten", ms(time.Since(start)), again.FrozenMs, again.Bytes)
	measure("checkpoint, none changed", func() {
		cp, err := c.Checkpoint(ctx, sb.ID(), "")
		if err != nil {
			t.Fatal(err)
		}
		frozen = append(frozen, cp.FrozenMs)
		cps = append(cps, cp.CheckpointID)
	})
	slices.Sort(frozen)
	t.Logf("%-28s median %8.1f ms", "  of which frozen", frozen[len(frozen)/2])
	var snaps []string
	measure("snapshot", func() {
		sn, err := c.CreateSnapshot(ctx, sb.ID(), "")
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, sn.SnapshotID)
	})
	measure("diff checkpoint→now", func() {
		if _, err := c.Diff(ctx, sb.ID(), cps[0], ""); err != nil {
			t.Fatal(err)
		}
	})
	measure("fork of 10", func() {
		forks, errs, err := c.Fork(ctx, sb.ID(), 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for i, f := range forks {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			defer c.Kill(ctx, f.ID())
		}
	})
	// A rewind to the last checkpoint hands over the standby booted on it
	// (given the second it takes to boot); one to another checkpoint
	// boots (alternating between two, since the standby follows a rewind).
	last := cps[len(cps)-1]
	var handed []time.Duration
	for range runs {
		time.Sleep(time.Second)
		start := time.Now()
		if err := c.Rewind(ctx, sb.ID(), last); err != nil {
			t.Fatal(err)
		}
		handed = append(handed, time.Since(start))
	}
	report(t, "rewind to the last (standby)", handed)
	var booted []time.Duration
	for i := range runs {
		start := time.Now()
		if err := c.Rewind(ctx, sb.ID(), cps[i%2]); err != nil {
			t.Fatal(err)
		}
		booted = append(booted, time.Since(start))
	}
	report(t, "rewind to another (boot)", booted)
	var coldPauses, coldResumes []time.Duration
	for range runs {
		start := time.Now()
		if err := c.PauseWithoutMemory(ctx, sb.ID()); err != nil {
			t.Fatal(err)
		}
		coldPauses = append(coldPauses, time.Since(start))
		start = time.Now()
		if _, err := c.Connect(ctx, sb.ID(), 10*time.Minute); err != nil {
			t.Fatal(err)
		}
		coldResumes = append(coldResumes, time.Since(start))
	}
	report(t, "pause without memory", coldPauses)
	report(t, "resume without memory", coldResumes)
	for _, s := range snaps {
		c.DeleteSnapshot(ctx, s)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func report(t *testing.T, name string, ds []time.Duration) {
	slices.Sort(ds)
	t.Logf("%-28s median %8.1f ms  (min %.1f, max %.1f, %d runs)", name, ms(ds[len(ds)/2]), ms(ds[0]), ms(ds[len(ds)-1]), len(ds))
}
