package bench

import (
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
	"github.com/fencesandbox/fence/internal/isolation/native"
)

// The steps of a traced create cover it whole: their means add up to the
// mean of the create from its call to its return, each step is reported,
// and a trace without the init's marks (an untraced init) is left out.
func TestCreateStepsAddUp(t *testing.T) {
	var ts []native.CreateTrace
	for i := range 4 { // the first is the warm-up's, left out
		tr := native.CreateTrace{Start: 1_000_000, Init: make([]int64, nsinit.NumMarks)}
		at := tr.Start
		step := int64(100_000 * (i + 1)) // 0.1 ms per step in the first, 0.2 in the second...
		for m := range native.MarkAttached {
			at += step
			tr.Daemon[m] = at
		}
		for m := range nsinit.NumMarks {
			at += step
			tr.Init[m] = at
		}
		for _, m := range []int{native.MarkStarted, native.MarkReturned} {
			at += step
			tr.Daemon[m] = at
		}
		tr.Daemon[native.MarkAttached] = tr.Daemon[native.MarkSent]
		tr.Daemon[native.MarkJoined] = tr.Daemon[native.MarkCgroup]
		tr.Daemon[native.MarkNetwork] = tr.Daemon[native.MarkCgroup]
		tr.Daemon[native.MarkGoAhead] = tr.Init[nsinit.MarkClosed]
		ts = append(ts, tr)
	}
	ts = append(ts, native.CreateTrace{Start: 1})
	var b strings.Builder
	writeCreateSteps(&b, ts)
	out := b.String()
	t.Log(out)
	if !strings.Contains(out, "(3 creates;") {
		t.Errorf("want 3 creates counted")
	}
	// 16 steps of 0.2, 0.3 and 0.4 ms: a mean of 4.8 ms, as the whole.
	n := len(createSteps)
	mean := "4.80 ms"
	if n != 16 {
		t.Fatalf("%d steps, the test counts 16", n)
	}
	for _, line := range []string{"sum", "the create, from its call to its return"} {
		found := false
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), line) && strings.HasSuffix(strings.TrimSpace(l), mean) {
				found = true
			}
		}
		if !found {
			t.Errorf("no line %q with a mean of %s", line, mean)
		}
	}
	for _, s := range createSteps {
		if !strings.Contains(out, s.name) {
			t.Errorf("step %q not reported", s.name)
		}
	}
}
