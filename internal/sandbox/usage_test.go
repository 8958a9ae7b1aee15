package sandbox

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestUsageAccumulates: CPU is the counter's growth, memory the
// trapezoid of the readings, idle the running intervals under 1% of a
// core, and running and paused time split at the transitions.
func TestUsageAccumulates(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	u := newUsage("key:x", t0, false)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	u.add(at(5), 1*time.Second, 1<<30)                     // first reading: 5 s at 1 GiB
	u.add(at(10), 2*time.Second, 1<<30)                    // 5 s, 1 CPU-s: busy
	u.add(at(15), 2*time.Second+time.Millisecond, 3<<30/2) // 5 s, 1 ms: idle; 1.25 GiB average
	u.mark(at(15), true)
	u.add(at(20), 2*time.Second+time.Millisecond, 3<<30/2) // paused: not idle
	u.mark(at(20), false)
	got := u.snapshot(at(25))
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
	u.add(at(30), time.Second, 0)
	if s := u.snapshot(at(30)); s.CPUSeconds != got.CPUSeconds {
		t.Errorf("cpu went from %v to %v on a lower reading", got.CPUSeconds, s.CPUSeconds)
	}
}

// TestUsageClockIsMonotonic: the times a sandbox's usage is measured
// between keep the clock's monotonic reading through create, pause,
// resume and a reading, so a step of the wall clock during its life is
// not charged as running or paused time.
func TestUsageClockIsMonotonic(t *testing.T) {
	e := newEnv(t)
	s := e.mustCreate(t, CreateRequest{})
	acc := func(what string) {
		t.Helper()
		e.m.mu.Lock()
		en := e.m.running[s.ID]
		e.m.mu.Unlock()
		en.mu.Lock()
		u := en.use
		en.mu.Unlock()
		for name, at := range map[string]time.Time{"created": u.created, "stateSince": u.stateSince, "lastAt": u.lastAt} {
			if name == "lastAt" && !u.have {
				continue
			}
			// A time with a monotonic reading prints it as "m=±s".
			if !strings.Contains(at.String(), " m=") {
				t.Errorf("after %s: usage %s %v has no monotonic reading", what, name, at)
			}
		}
	}
	acc("create")
	if err := e.m.Pause(t.Context(), s.ID); err != nil {
		t.Fatal(err)
	}
	acc("pause")
	if _, err := e.m.Resume(t.Context(), s.ID, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	acc("resume")
	if _, err := e.m.Usage(t.Context(), UsageFilter{Sandbox: s.ID}); err != nil {
		t.Fatal(err)
	}
	acc("a reading")
}
