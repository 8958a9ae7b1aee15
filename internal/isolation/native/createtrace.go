package native

import (
	"sync"

	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
)

// The daemon's steps of a create, as timed when creates are traced
// (TraceCreates): each mark is the CLOCK_MONOTONIC time at which the step
// ended, on the same clock as the init's (nsinit's Mark constants).
const (
	MarkTook     = iota // room for it waited for and a ready init taken
	MarkCgroup          // its cgroups and network begun, beside the next steps
	MarkDirs            // state directory, writable layer and its files
	MarkListener        // the agent's listener
	MarkSent            // detached mounts made and the Config sent
	MarkAttached        // init in its cgroups and network attached (both run beside the steps from MarkCgroup; no earlier than MarkSent)
	MarkJoined          // its cgroups made (renamed) with their limits, the init in them (beside the steps, from MarkCgroup)
	MarkNetwork         // network attached (beside the steps, from MarkCgroup)
	MarkGoAhead         // the go-ahead about to be sent
	MarkStarted         // the init's answer that it serves read
	MarkReturned        // Create about to return
	NumMarks
)

// CreateTrace is one traced create.
type CreateTrace struct {
	// Start is when Create was called (CLOCK_MONOTONIC, ns).
	Start int64
	// Daemon holds the daemon's marks, Mark* of this package.
	Daemon [NumMarks]int64
	// Init holds the init's marks (nsinit.Mark*); nil when the init sent
	// none.
	Init []int64
}

func (t *CreateTrace) mark(i int) {
	if t != nil {
		t.Daemon[i] = nsinit.Monotonic()
	}
}

// maxTraces bounds the traces a backend keeps.
const maxTraces = 100_000

type createTraces struct {
	mu sync.Mutex
	// +checklocks:mu
	on bool
	// +checklocks:mu
	done []CreateTrace
}

// begin returns a trace for a create starting now, or nil when creates
// are not traced.
func (c *createTraces) begin() *CreateTrace {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on {
		return nil
	}
	return &CreateTrace{Start: nsinit.Monotonic()}
}

// add keeps the trace of a create that succeeded.
func (c *createTraces) add(t *CreateTrace) {
	if t == nil {
		return
	}
	t.mark(MarkReturned)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.on && len(c.done) < maxTraces {
		c.done = append(c.done, *t)
	}
}

// TraceCreates turns the timing of creates' steps on or off, and drops
// the traces kept so far. A traced create's init sends its own steps'
// times with its answer (nsinit.Config.Trace). `fence bench` uses it.
func (b *Backend) TraceCreates(on bool) {
	b.traces.mu.Lock()
	defer b.traces.mu.Unlock()
	b.traces.on, b.traces.done = on, nil
}

// CreateTraces returns the traces of the creates that succeeded since
// TraceCreates(true), in the order they ended.
func (b *Backend) CreateTraces() []CreateTrace {
	b.traces.mu.Lock()
	defer b.traces.mu.Unlock()
	return append([]CreateTrace(nil), b.traces.done...)
}
