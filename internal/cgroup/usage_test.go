package cgroup

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"
)

// TestUsage checks what Usage reads against Stats, and what a reading
// costs: the daemon takes one of every sandbox every few seconds, so its
// cost is paid once per sandbox alive. Three control files opened and
// nothing allocated per reading (Stats, which the daemon's readings used,
// opens five and allocates for each).
func TestUsage(t *testing.T) {
	m := testManager(t)
	g, err := m.Create("usage", Limits{MemoryBytes: 256 << 20, Pids: 64})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	// Two tasks that used some CPU and memory.
	start(t, g, "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; x=$(head -c 4000000 /dev/zero | tr '\\0' a); sleep 60 & exec sleep 60")
	// The two sleeps: the shell counts two tasks for a while before them
	// too (itself and its command substitution's subshell, which may wait
	// to be reaped for as long as the host keeps the shell off the CPU),
	// which a later reading would no longer see.
	waitFor(t, "two sleeps", func() bool {
		pids, err := g.Pids()
		if err != nil || len(pids) != 2 {
			return false
		}
		for _, pid := range pids {
			if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err != nil || string(comm) != "sleep\n" {
				return false
			}
		}
		return true
	})
	u, err := g.Usage()
	if err != nil {
		t.Fatalf("Usage error: %v", err)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatalf("Stats error: %v", err)
	}
	if u.Pids != st.Pids || u.CPUUsage <= 0 || u.CPUUsage > st.CPUUsage || u.MemoryBytes <= 0 {
		t.Errorf("Usage() = %+v, want the pids of Stats() = %+v, CPU and memory above 0, CPU at most Stats'", u, st)
	}
	if u.MemoryLimit != 0 || u.OOMKills != 0 {
		t.Errorf("Usage() = %+v, want no limit or OOM count (not read)", u)
	}

	opened := func(f func()) int64 {
		before := controlOpens.Load()
		f()
		return controlOpens.Load() - before
	}
	if n := opened(func() { g.Usage() }); n != 3 {
		t.Errorf("Usage opened %d control files, want 3", n)
	}
	if allocs := testing.AllocsPerRun(50, func() {
		if _, err := g.Usage(); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("Usage allocated %.1f times per reading, want 0", allocs)
	}
	statsAllocs := testing.AllocsPerRun(50, func() { g.Stats() })
	t.Logf("Stats: %d control files opened, %.1f allocations per reading", opened(func() { g.Stats() }), statsAllocs)
}

// TestUsageSinceReadsOnlyCPUOfAnIdleGroup: the daemon reads every
// sandbox's use every few seconds, most of them idle; a group whose tasks
// ran nothing since the last reading costs one control file (its CPU
// time) and gives that reading back, and one whose tasks ran is read
// whole.
func TestUsageSinceReadsOnlyCPUOfAnIdleGroup(t *testing.T) {
	m := testManager(t)
	g, err := m.Create("idle", Limits{Pids: 64})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	start(t, g, "exec sleep 60")
	var prev Stats
	waitFor(t, "the group idle (one task, its CPU time still)", func() bool {
		u, err := g.Usage()
		idle := err == nil && u.Pids == 1 && u.CPUUsage > 0 && u.CPUUsage == prev.CPUUsage
		prev = u
		return idle
	})
	opened := func(f func()) int64 {
		before := controlOpens.Load()
		f()
		return controlOpens.Load() - before
	}
	var (
		u   Stats
		ran bool
	)
	if n := opened(func() { u, ran, err = g.UsageSince(prev) }); err != nil || n != 1 || ran || u != prev {
		t.Errorf("UsageSince(%+v) of the idle group = %+v, ran %v, %v, %d control files opened; want it back, not ran, 1 file", prev, u, ran, err, n)
	}
	if n := opened(func() { u, ran, err = g.UsageSince(Stats{}) }); err != nil || n != 3 || !ran || u != prev {
		t.Errorf("UsageSince(none) of the idle group = %+v, ran %v, %v, %d control files opened; want %+v read whole (3 files)", u, ran, err, n, prev)
	}
	p := start(t, g, "exit 0")
	<-p.done
	if n := opened(func() { u, ran, err = g.UsageSince(prev) }); err != nil || n != 3 || !ran || u.CPUUsage <= prev.CPUUsage {
		t.Errorf("UsageSince(%+v) after a task ran = %+v, ran %v, %v, %d control files opened; want more CPU time, ran, 3 files", prev, u, ran, err, n)
	}
}

func TestParseUsage(t *testing.T) {
	for _, tc := range []struct {
		in   string
		key  string
		want int64
		ok   bool
	}{
		{"123\n", "", 123, true},
		{"0", "", 0, true},
		{"9223372036854775807\n", "", 1<<63 - 1, true},
		{"9223372036854775808\n", "", 0, false},
		{"-1\n", "", 0, false},
		{"max\n", "", 0, false},
		{"", "", 0, false},
		{"usage_usec 42\nuser_usec 40\nsystem_usec 2\n", "usage_usec", 42, true},
		{"user_usec 40\nusage_usec 7", "usage_usec", 7, true},
		{"usage_usec_x 5\n", "usage_usec", 0, true}, // no such key
		{"usage_usec\n", "usage_usec", 0, true},
	} {
		got, ok := parseUsage([]byte(tc.in), tc.key)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parse(%q, key %q) = %d, %v; want %d, %v", tc.in, tc.key, got, ok, tc.want, tc.ok)
		}
	}
}

// TestUsageV2 reads Usage on the cgroup2 hierarchy, where CPU time comes
// from a keyed file.
func TestUsageV2(t *testing.T) {
	m := v2Manager(t, fmt.Sprintf("fence-test-%d/usagev2", os.Getpid()))
	g, err := m.Create("usage", Limits{})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	start(t, g, "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec sleep 60")
	waitFor(t, "CPU time", func() bool {
		u, err := g.Usage()
		return err == nil && u.CPUUsage > 0
	})
	u, err := g.Usage()
	st, serr := g.Stats()
	if err != nil || serr != nil {
		t.Fatalf("Usage error %v, Stats error %v", err, serr)
	}
	if u.CPUUsage > st.CPUUsage || st.CPUUsage-u.CPUUsage > time.Second || (slices.Contains(m.avail, "pids") && u.Pids != st.Pids) {
		t.Errorf("Usage() = %+v, want the CPU time and pids of Stats() = %+v", u, st)
	}
}

// TestUsageSinceHeldOpensTheCPUFileOnce checks that the readings of an
// idle group through a HeldCPU open its CPU time file once, not once a
// reading, and still see CPU time that moved.
func TestUsageSinceHeldOpensTheCPUFileOnce(t *testing.T) {
	m := testManager(t)
	g, err := m.Create("held", Limits{Pids: 64})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	start(t, g, "exec sleep 60")
	var prev Stats
	waitFor(t, "the group idle (one task, its CPU time still)", func() bool {
		u, err := g.Usage()
		idle := err == nil && u.Pids == 1 && u.CPUUsage > 0 && u.CPUUsage == prev.CPUUsage
		prev = u
		return idle
	})
	var held HeldCPU
	defer held.Close()
	before := controlOpens.Load()
	const readings = 12 // a minute of readings every 5 s
	for i := range readings {
		u, ran, err := g.UsageSinceHeld(&held, prev)
		if err != nil || ran || u != prev {
			t.Fatalf("reading %d of the idle group = %+v, ran %v, %v; want %+v back, not ran", i, u, ran, err, prev)
		}
	}
	if n := controlOpens.Load() - before; n != 1 {
		t.Errorf("%d readings of an idle group through a HeldCPU opened %d control files; want 1", readings, n)
	}
	p := start(t, g, "exit 0")
	<-p.done
	u, ran, err := g.UsageSinceHeld(&held, prev)
	if err != nil || !ran || u.CPUUsage <= prev.CPUUsage {
		t.Errorf("held reading after a task ran = %+v, ran %v, %v; want more CPU time than %v, ran", u, ran, err, prev.CPUUsage)
	}
	held.Close()
	before = controlOpens.Load()
	if _, _, err := g.UsageSinceHeld(&held, u); err != nil || controlOpens.Load()-before != 1 {
		t.Errorf("reading after Close: %v, %d files opened; want the CPU file opened by its path", err, controlOpens.Load()-before)
	}
}
