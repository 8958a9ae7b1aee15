package httpapi

import (
	"context"
	"sync"
)

// warmups are the warm-ups of new agents' connections in flight
// (warmAgent), by sandbox. A sandbox's first command usually follows its
// create at once, while the warm-up's health check is still in the agent:
// the proxy's transport, finding no idle connection, would dial a second
// one beside it, and the new agent would set up two connections at its
// busiest moment. The first request waits for the warm-up instead and
// takes its connection; a warm-up ends within agentWarmTimeout.
type warmups struct {
	mu sync.Mutex
	// +checklocks:mu
	m map[string]chan struct{}
}

// begin marks id's warm-up as in flight until end is called.
func (w *warmups) begin(id string) (end func()) {
	ch := make(chan struct{})
	w.mu.Lock()
	if w.m == nil {
		w.m = map[string]chan struct{}{}
	}
	w.m[id] = ch
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		if w.m[id] == ch {
			delete(w.m, id)
		}
		w.mu.Unlock()
		close(ch)
	}
}

// wait returns once id has no warm-up in flight, or ctx is done.
func (w *warmups) wait(ctx context.Context, id string) {
	w.mu.Lock()
	ch := w.m[id]
	w.mu.Unlock()
	if ch == nil {
		return
	}
	if warmWaiting != nil {
		warmWaiting(id)
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// warmWaiting, when set (by tests), is called when a request starts
// waiting for its sandbox's warm-up.
var warmWaiting func(id string)
