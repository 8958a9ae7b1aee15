package warm

import (
	"testing"
	"time"
)

// TestFillWait: a create that finds the pool empty waits for the fill on
// its way only when that fill is expected before a create of its own
// would be done, and never past that.
func TestFillWait(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	for _, c := range []struct {
		name                string
		first               time.Time
		fillTime, quickFill time.Duration
		wait                bool
		until               time.Duration // from now
	}{
		{"fills as quick as a create of its own", now.Add(-100 * ms), 300 * ms, 300 * ms, true, 300 * ms},
		{"a fill slowed by its weight, just begun", now, 400 * ms, 50 * ms, false, 0},
		{"a slowed fill about to arrive", now.Add(-380 * ms), 400 * ms, 50 * ms, true, 50 * ms},
		{"a fill not begun yet, quick", now.Add(25 * ms), 100 * ms, 200 * ms, true, 175 * ms},
		{"a fill past its slack", now.Add(-700 * ms), 400 * ms, 500 * ms, false, 0},
	} {
		deadline, wait := fillWait(now, c.first, c.fillTime, c.quickFill)
		if wait != c.wait || (wait && deadline.Sub(now) != c.until) {
			t.Errorf("%s: wait %v until +%v, want %v until +%v", c.name, wait, deadline.Sub(now), c.wait, c.until)
		}
	}
}
