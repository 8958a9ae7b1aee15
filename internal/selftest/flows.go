package selftest

import (
	"context"
	"net/netip"
	"sync"
	"time"
)

// Flow is one decision of a sandbox's network stack, as the selftest needs
// it.
type Flow struct {
	Proto   string // "tcp", "udp" or "dns"
	Dst     netip.AddrPort
	Name    string // for "dns", the question's name
	Allowed bool
	Reason  string
}

// maxFlows bounds a FlowLog; later flows are dropped.
const maxFlows = 4096

// flowWait is how long a check waits for the stack's record of a flow
// after the probe has seen its end (the stack records a refused flow
// right after refusing it). A variable for the tests.
var flowWait = 3 * time.Second

// FlowLog collects the flows of one sandbox. It is safe for concurrent use
// and holds at most 4096 flows.
type FlowLog struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every Record
	flows   []Flow
}

// NewFlowLog returns an empty FlowLog.
func NewFlowLog() *FlowLog {
	return &FlowLog{changed: make(chan struct{})}
}

// Record adds f.
func (l *FlowLog) Record(f Flow) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.flows) >= maxFlows {
		return
	}
	l.flows = append(l.flows, f)
	close(l.changed)
	l.changed = make(chan struct{})
}

// await returns the flows that match, waiting up to flowWait for the first.
func (l *FlowLog) await(ctx context.Context, match func(Flow) bool) []Flow {
	deadline := time.NewTimer(flowWait)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		var out []Flow
		for _, f := range l.flows {
			if match(f) {
				out = append(out, f)
			}
		}
		changed := l.changed
		l.mu.Unlock()
		if len(out) > 0 {
			return out
		}
		select {
		case <-changed:
		case <-deadline.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}
