package sandbox

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/fencesandbox/fence/internal/sandbox/idle"
)

// Idle pausing is the idle.Tracker's (Options.Idle): the API, the proxy
// and the SSH server mark each sandbox's use on it, and its loop (run by
// Start) asks, through idleCore, for the running sandboxes that have an
// idle timeout and has Pauses pause the idle ones with their memory. The
// resume of such a pause gives the sandbox back the time its deadline was
// ahead: time paused does not count (Pauses.resume).
var _ idle.Core = idleCore{}

// idleCore is the Manager as its idle.Tracker reaches it.
type idleCore struct{ m *Manager }

// candidatesCopied counts the entries Candidates copied, for tests.
var candidatesCopied atomic.Int64

// Candidates implements idle.Core. It looks at the sandboxes that have an
// idle timeout alone (Manager.idleable), not at every live one: it runs
// every second, under the Manager's lock.
func (c idleCore) Candidates() []idle.Candidate {
	m := c.m
	m.mu.Lock()
	live := make([]*entry, 0, len(m.idleable))
	for _, e := range m.idleable {
		live = append(live, e)
	}
	m.mu.Unlock()
	candidatesCopied.Add(int64(len(live)))
	var out []idle.Candidate
	for _, e := range live {
		e.mu.Lock()
		run, d, since := e.info.State == StateRunning, e.info.IdleTimeout, e.info.StartedAt
		e.mu.Unlock()
		if !run || d <= 0 {
			continue
		}
		ref := e.boxp.Load()
		out = append(out, idle.Candidate{ID: ref.ID(), Timeout: d, Since: since, Incarnation: ref.inc,
			CPU: func(ctx context.Context) (time.Duration, error) {
				st, err := ref.Stats(ctx)
				return st.CPUUsage, err
			}})
	}
	return out
}

// Pause implements idle.Core.
func (c idleCore) Pause(ctx context.Context, id string, quiet func() bool) error {
	return c.m.pauses.pauseIdle(ctx, id, quiet)
}
