package native_test

import (
	"testing"

	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
)

// A traced create records every step, the daemon's and its init's, on one
// clock and in the order the steps run; an untraced one records nothing.
func TestCreateTraceMarksEveryStep(t *testing.T) {
	b := newBackendWith(t, native.Options{ReadyInits: 1})
	create(t, b, isolation.Spec{})
	if n := len(b.CreateTraces()); n != 0 {
		t.Fatalf("%d traces before TraceCreates", n)
	}
	b.TraceCreates(true)
	create(t, b, isolation.Spec{})
	ts := b.CreateTraces()
	if len(ts) != 1 {
		t.Fatalf("%d traces after one traced create, want 1", len(ts))
	}
	tr := ts[0]
	if len(tr.Init) != nsinit.NumMarks {
		t.Fatalf("the init sent %d marks, want %d", len(tr.Init), nsinit.NumMarks)
	}
	// The order the steps run in: the daemon's until it sends the Config,
	// the init's to the agent serving, then the daemon's answer. The
	// daemon's mark of the Config sent is taken once its write returns,
	// which may be after the init has read it: it only falls between the
	// listener and the answer.
	seq := []struct {
		name string
		at   int64
	}{{"start", tr.Start}}
	for i, n := range []string{"took", "cgroup", "dirs", "listener"} {
		seq = append(seq, struct {
			name string
			at   int64
		}{"daemon " + n, tr.Daemon[native.MarkTook+i]})
	}
	for i := range nsinit.NumMarks {
		seq = append(seq, struct {
			name string
			at   int64
		}{"init mark " + string(rune('0'+i)), tr.Init[i]})
	}
	seq = append(seq, struct {
		name string
		at   int64
	}{"daemon started", tr.Daemon[native.MarkStarted]}, struct {
		name string
		at   int64
	}{"daemon returned", tr.Daemon[native.MarkReturned]})
	for i := 1; i < len(seq); i++ {
		if seq[i].at == 0 || seq[i].at < seq[i-1].at {
			t.Errorf("%s at %d, before %s at %d", seq[i].name, seq[i].at, seq[i-1].name, seq[i-1].at)
		}
	}
	if sent := tr.Daemon[native.MarkSent]; sent < tr.Daemon[native.MarkListener] || sent > tr.Daemon[native.MarkStarted] {
		t.Errorf("daemon sent at %d, outside listener %d … started %d", sent, tr.Daemon[native.MarkListener], tr.Daemon[native.MarkStarted])
	}
	// What ran beside: the go-ahead went after the cgroups were joined
	// and the network attached, and the init read it after.
	for _, m := range []int{native.MarkJoined, native.MarkNetwork, native.MarkAttached} {
		if tr.Daemon[m] == 0 || tr.Daemon[m] > tr.Daemon[native.MarkGoAhead] {
			t.Errorf("mark %d at %d, go-ahead sent at %d", m, tr.Daemon[m], tr.Daemon[native.MarkGoAhead])
		}
	}
	if tr.Init[nsinit.MarkGoAhead] < tr.Daemon[native.MarkGoAhead] {
		t.Errorf("the init read the go-ahead at %d, before it was sent at %d", tr.Init[nsinit.MarkGoAhead], tr.Daemon[native.MarkGoAhead])
	}
	b.TraceCreates(false)
	create(t, b, isolation.Spec{})
	if n := len(b.CreateTraces()); n != 0 {
		t.Fatalf("%d traces after TraceCreates(false)", n)
	}
}
