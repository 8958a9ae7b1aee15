package usage

import (
	"math"
	"testing"
	"time"
)

// TestUsageAccumulates: CPU is the counter's growth, memory the
// trapezoid of the readings, idle the running intervals under 1% of a
// core, and running and paused time split at the transitions.
func TestUsageAccumulates(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	u := (&Meter{}).Start("key:x", t0, false)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	u.Add(at(5), 1*time.Second, 1<<30)                     // first reading: 5 s at 1 GiB
	u.Add(at(10), 2*time.Second, 1<<30)                    // 5 s, 1 CPU-s: busy
	u.Add(at(15), 2*time.Second+time.Millisecond, 3<<30/2) // 5 s, 1 ms: idle; 1.25 GiB average
	u.Mark(at(15), true)
	u.Add(at(20), 2*time.Second+time.Millisecond, 3<<30/2) // paused: not idle
	u.Mark(at(20), false)
	got := u.Snapshot(at(25))
	near := func(what string, got, want float64) {
		if math.Abs(got-want) > 1e-6 {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	near("cpu", got.CPUSeconds, 2.001)
	near("GiB-s", got.MemoryGiBSeconds, 5+5+6.25+7.5)
	near("idle", got.IdleSeconds, 5)
	near("running", got.RunningSeconds, 20)
	near("paused", got.PausedSeconds, 5)
	// A counter that goes back (cannot, but) adds nothing.
	u.Add(at(30), time.Second, 0)
	if s := u.Snapshot(at(30)); s.CPUSeconds != got.CPUSeconds {
		t.Errorf("cpu went from %v to %v on a lower reading", got.CPUSeconds, s.CPUSeconds)
	}
}
