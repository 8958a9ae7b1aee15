package cgroup

import (
	"os"
	"path/filepath"
	"testing"
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
