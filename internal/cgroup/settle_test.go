package cgroup

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSettle: Settle lets a group go once a process's start (CPU spent)
// is over and it waits, and lets a group busy all along go after
// SettleWait without calling it quiet.
func TestSettle(t *testing.T) {
	m := testManager(t)

	t.Run("past a start", func(t *testing.T) {
		g, err := m.Create("settle-start", Limits{Pids: 64})
		if err != nil {
			t.Fatal(err)
		}
		marker := filepath.Join(t.TempDir(), "started")
		// A start that takes CPU (a loop), then the work that waits.
		start(t, g, "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; : > "+marker+"; exec sleep 60")
		waited, quiet := g.Settle(t.Context(), nil)
		if !quiet {
			// A starved host can keep the loop from finishing within
			// SettleWait; that is the bound working.
			t.Logf("the group was still busy after %v", waited)
			return
		}
		if _, err := os.Stat(marker); err != nil {
			t.Errorf("Settle called the group quiet before its start was over: %v", err)
		}
	})

	t.Run("busy all along", func(t *testing.T) {
		g, err := m.Create("settle-busy", Limits{Pids: 64})
		if err != nil {
			t.Fatal(err)
		}
		start(t, g, "while :; do :; done")
		waited, quiet := g.Settle(t.Context(), nil)
		if quiet || waited < SettleWait {
			t.Errorf("Settle of a busy group = (%v, %v), want not quiet after at least %v", waited, quiet, SettleWait)
		}
	})

	t.Run("busy but starved", func(t *testing.T) {
		// A group that wants a CPU all along and gets next to none of it
		// (the host's CPUs taken by others, here a sibling group of the
		// highest weight on the one CPU both may use) is busy: it is
		// waiting, not quiet. Its CPU use alone stays under a tenth of a
		// CPU in every window.
		hog, err := m.Create("settle-hog", Limits{Pids: 64})
		if err != nil {
			t.Fatal(err)
		}
		starved, err := m.Create("settle-starved", Limits{Pids: 64})
		if err != nil {
			t.Fatal(err)
		}
		if err := hog.SetWeight(262144); err != nil {
			t.Fatal(err)
		}
		if err := starved.SetWeight(2); err != nil {
			t.Fatal(err)
		}
		var one unix.CPUSet
		one.Set(0)
		var procs []*proc
		for _, g := range []*Group{hog, starved} {
			p := start(t, g, "while :; do :; done")
			procs = append(procs, p)
			if err := unix.SchedSetaffinity(p.Process.Pid, &one); err != nil {
				t.Fatal(err)
			}
		}
		// The hog is killed first (cleanups run last in, first out):
		// the starved shell needs the CPU back to die.
		t.Cleanup(func() { procs[0].Process.Kill() })
		waited, quiet := starved.Settle(t.Context(), nil)
		if quiet || waited < SettleWait {
			t.Errorf("Settle of a busy group starved of CPU = (%v, %v), want not quiet after at least %v", waited, quiet, SettleWait)
		}
	})

	t.Run("done", func(t *testing.T) {
		g, err := m.Create("settle-done", Limits{Pids: 64})
		if err != nil {
			t.Fatal(err)
		}
		start(t, g, "while :; do :; done")
		done := make(chan struct{})
		close(done)
		if _, quiet := g.Settle(t.Context(), done); quiet {
			t.Errorf("Settle with done closed called a busy group quiet")
		}
	})
}

// TestSettleStarts: a group whose processes all started more than
// SettleWait ago is let go at once, without sampling; a process just
// started counts as a recent start.
func TestSettleStarts(t *testing.T) {
	m := testManager(t)
	g, err := m.Create("settle-starts", Limits{Pids: 64})
	if err != nil {
		t.Fatal(err)
	}
	start(t, g, "exec sleep 60")
	pids, err := g.Pids()
	if err != nil || len(pids) == 0 {
		t.Fatalf("pids %v, %v", pids, err)
	}
	if !startedWithin(pids, time.Hour) {
		t.Fatalf("a process started just now is not within the last hour")
	}
	time.Sleep(SettleWait + 100*time.Millisecond)
	if startedWithin(pids, SettleWait) {
		t.Fatalf("a process started over %v ago counts as a recent start", SettleWait)
	}
	if waited, quiet := g.SettleStarts(t.Context(), nil); waited != 0 || !quiet {
		t.Errorf("SettleStarts of a group with no recent start = (%v, %v), want (0, true)", waited, quiet)
	}
}

func TestStatState(t *testing.T) {
	for line, want := range map[string]byte{
		"4242 (a (weird) R name) S 1 4242": 'S',
		"4242 (sh) R 1 4242":               'R',
		"4242 (sh)":                        0,
		"garbage":                          0,
	} {
		if got := statState([]byte(line)); got != want {
			t.Errorf("statState(%q) = %q, want %q", line, got, want)
		}
	}
}

func TestStatStartTime(t *testing.T) {
	line := []byte("4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615")
	if v, ok := statStartTime(line); !ok || v != 987654 {
		t.Errorf("statStartTime = %d, %v; want 987654", v, ok)
	}
	if _, ok := statStartTime([]byte("4242 (x) S 1")); ok {
		t.Errorf("a short line parsed")
	}
}
