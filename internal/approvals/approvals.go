// Package approvals is fence's queue of egress approval requests: a
// sandbox created with network approval "ask" that looks up a name its
// policy does not allow is held while a person decides, through the
// daemon's API, whether it may reach that name.
//
// # What it guarantees
//
//   - [Queue.Ask] blocks until a decision, the request's timeout
//     ([Options.Timeout], default 60 s) or the end of its context,
//     whichever comes first; a timeout or a cancelled context is a deny,
//     and the request is gone from the queue when Ask returns.
//   - One sandbox has at most [Options.PerSandbox] (default 16) pending
//     requests and the daemon at most [Options.Max] (default 4096); an Ask
//     over either bound is refused at once with [ErrFull] and counted
//     ([Stats.Refused]), without a request, an event or a goroutine. A
//     second Ask for a name a sandbox already waits on joins the pending
//     request instead of making another, so a flood of lookups for one
//     name costs one request, and a flood of new names costs at most
//     PerSandbox requests.
//   - A decision is made once: [Queue.Decide] on a decided, timed-out or
//     unknown request is [api.ErrNotFound]. [Options.Apply] runs before the
//     held callers are woken, so a "sandbox" or "team" decision is in the
//     policy before the held lookup proceeds; if Apply fails the request
//     stays pending and Decide returns its error.
//   - Requests of a sandbox that goes away ([Queue.Drop]) are denied at once.
//   - Subscribers ([Queue.Subscribe]) get every new and decided request on
//     a bounded channel; a subscriber that does not keep up loses events
//     (counted in [Stats.Dropped]) and never blocks the queue.
//
// # What it does not do
//
// It does not decide who may call Decide (the API's authentication and
// ownership checks do), does not change any policy itself (Apply does),
// and does not persist: pending requests end with the daemon, and the
// held lookups with them.
package approvals

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencesandbox/fence/api"
)

// Decision is what a person decided about a request.
type Decision string

// Decisions. Timeout is never given to Decide: it is the outcome of a
// request nobody decided in time (or whose sandbox went away).
const (
	Once    Decision = "once"    // this lookup proceeds; the policy is unchanged
	Sandbox Decision = "sandbox" // the name is added to the sandbox's policy
	Team    Decision = "team"    // the name is allowed team-wide
	Deny    Decision = "deny"    // this lookup is refused
	Timeout Decision = "timeout" // nobody decided in time
)

// Allows reports whether d lets the held lookup proceed.
func (d Decision) Allows() bool { return d == Once || d == Sandbox || d == Team }

// ParseDecision parses a decision given to Decide.
func ParseDecision(s string) (Decision, error) {
	switch d := Decision(s); d {
	case Once, Sandbox, Team, Deny:
		return d, nil
	}
	return "", fmt.Errorf("decision %q: want once, sandbox, team or deny: %w", s, api.ErrInvalidArgument)
}

// ErrFull refuses an Ask over the queue's bounds.
var ErrFull = fmt.Errorf("too many pending approval requests: %w", api.ErrResourceExhausted)

// Request is one pending (or just decided) request.
type Request struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandboxID"`
	TeamID    string    `json:"teamID,omitempty"`
	Name      string    `json:"name"`
	Created   time.Time `json:"created"`
	Deadline  time.Time `json:"deadline"`
	// Decision and Actor are set once it is decided.
	Decision Decision `json:"decision,omitempty"`
	Actor    string   `json:"actor,omitempty"`
}

// Event is a new or decided request, as subscribers see it.
type Event struct {
	Type    string  `json:"type"` // "pending" or "decided"
	Request Request `json:"request"`
}

// Options configure a Queue.
type Options struct {
	// Timeout is how long a request waits for a decision (default 60 s).
	Timeout time.Duration
	// PerSandbox bounds one sandbox's pending requests (default 16).
	PerSandbox int
	// Max bounds all pending requests (default 4096).
	Max int
	// Apply, if set, is called by Decide with the decided request before
	// the held callers are woken; an error leaves the request pending.
	Apply func(ctx context.Context, r Request) error
	// Decided, if set, is called once for every request that ends (decided,
	// timed out or dropped), before the held callers are woken: the audit
	// record of the decision comes before the flow it lets through.
	Decided func(r Request)
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Stats are the queue's counters.
type Stats struct {
	Pending  int   // requests waiting now
	Asked    int64 // requests made
	Joined   int64 // Asks that joined a pending request for the same name
	Refused  int64 // Asks refused at once over the bounds
	Allowed  int64 // requests decided once, sandbox or team
	Denied   int64 // requests decided deny
	TimedOut int64 // requests that timed out or whose sandbox went away
	Dropped  int64 // events a slow subscriber lost
}

// Queue holds the pending requests. Make one with New; it is safe for
// concurrent use.
type Queue struct {
	opts Options

	mu sync.Mutex
	// +checklocks:mu
	byID map[string]*pending
	// +checklocks:mu
	byKey map[key]*pending
	// +checklocks:mu
	perSandbox map[string]int
	// +checklocks:mu
	subs map[chan Event]struct{}

	asked, joined, refused, allowed, denied, timedOut, dropped atomic.Int64
}

type key struct{ sandbox, name string }

type pending struct {
	req  Request
	done chan struct{} // closed when decided; req.Decision is then set
}

// New returns an empty Queue.
func New(opts Options) *Queue {
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	if opts.PerSandbox <= 0 {
		opts.PerSandbox = 16
	}
	if opts.Max <= 0 {
		opts.Max = 4096
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Queue{opts: opts, byID: map[string]*pending{}, byKey: map[key]*pending{},
		perSandbox: map[string]int{}, subs: map[chan Event]struct{}{}}
}

// Timeout returns how long a request waits for a decision.
func (q *Queue) Timeout() time.Duration { return q.opts.Timeout }

// Ask asks whether sandboxID (of team teamID) may reach name and waits for
// the answer. It returns ErrFull at once over the bounds; a timeout or the
// end of ctx is the decision Timeout.
func (q *Queue) Ask(ctx context.Context, sandboxID, teamID, name string) (Decision, error) {
	p, err := q.enqueue(sandboxID, teamID, name)
	if err != nil {
		return Deny, err
	}
	t := time.NewTimer(time.Until(p.req.Deadline))
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		q.finish(p, Timeout, "")
	case <-ctx.Done():
		q.finish(p, Timeout, "")
	}
	<-p.done
	return p.req.Decision, nil
}

func (q *Queue) enqueue(sandboxID, teamID, name string) (*pending, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := key{sandboxID, name}
	if p := q.byKey[k]; p != nil {
		q.joined.Add(1)
		return p, nil
	}
	if q.perSandbox[sandboxID] >= q.opts.PerSandbox || len(q.byID) >= q.opts.Max {
		q.refused.Add(1)
		return nil, ErrFull
	}
	now := q.opts.Now()
	p := &pending{done: make(chan struct{}), req: Request{ID: newID(), SandboxID: sandboxID, TeamID: teamID,
		Name: name, Created: now, Deadline: now.Add(q.opts.Timeout)}}
	q.byID[p.req.ID] = p
	q.byKey[k] = p
	q.perSandbox[sandboxID]++
	q.asked.Add(1)
	q.publishLocked(Event{Type: "pending", Request: p.req})
	return p, nil
}

// finish removes p and wakes its callers with decision d, unless it was
// decided already; it reports whether it did.
func (q *Queue) finish(p *pending, d Decision, actor string) bool {
	q.mu.Lock()
	if q.byID[p.req.ID] != p {
		q.mu.Unlock()
		return false
	}
	q.removeLocked(p)
	p.req.Decision, p.req.Actor = d, actor
	switch {
	case d.Allows():
		q.allowed.Add(1)
	case d == Deny:
		q.denied.Add(1)
	default:
		q.timedOut.Add(1)
	}
	q.publishLocked(Event{Type: "decided", Request: p.req})
	q.mu.Unlock()
	if q.opts.Decided != nil {
		q.opts.Decided(p.req)
	}
	close(p.done)
	return true
}

// +checklocks:q.mu
func (q *Queue) removeLocked(p *pending) {
	delete(q.byID, p.req.ID)
	delete(q.byKey, key{p.req.SandboxID, p.req.Name})
	if q.perSandbox[p.req.SandboxID]--; q.perSandbox[p.req.SandboxID] <= 0 {
		delete(q.perSandbox, p.req.SandboxID)
	}
}

// Decide decides request id on behalf of actor (the audit actor of the
// request that decided it). A request that is not pending, or that
// visible refuses (a request of another team), is an error wrapping
// api.ErrNotFound; visible may be nil.
func (q *Queue) Decide(ctx context.Context, id string, d Decision, actor string, visible func(Request) bool) (Request, error) {
	if _, err := ParseDecision(string(d)); err != nil {
		return Request{}, err
	}
	q.mu.Lock()
	p := q.byID[id]
	q.mu.Unlock()
	if p == nil || (visible != nil && !visible(p.req)) {
		return Request{}, fmt.Errorf("approval request %q: %w", id, api.ErrNotFound)
	}
	r := p.req
	r.Decision, r.Actor = d, actor
	if q.opts.Apply != nil {
		if err := q.opts.Apply(ctx, r); err != nil {
			return Request{}, err
		}
	}
	if !q.finish(p, d, actor) {
		return Request{}, fmt.Errorf("approval request %q was decided meanwhile: %w", id, api.ErrNotFound)
	}
	return r, nil
}

// List returns the pending requests that visible accepts (all when nil),
// oldest first.
func (q *Queue) List(visible func(Request) bool) []Request {
	q.mu.Lock()
	out := make([]Request, 0, len(q.byID))
	for _, p := range q.byID {
		if visible == nil || visible(p.req) {
			out = append(out, p.req)
		}
	}
	q.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Drop denies every pending request of sandboxID (it is gone).
func (q *Queue) Drop(sandboxID string) {
	q.mu.Lock()
	var ps []*pending
	for _, p := range q.byID {
		if p.req.SandboxID == sandboxID {
			ps = append(ps, p)
		}
	}
	q.mu.Unlock()
	for _, p := range ps {
		q.finish(p, Timeout, "")
	}
}

// subBuffer is each subscriber's channel capacity.
const subBuffer = 64

// Subscribe returns a channel of events until ctx ends, when it is closed.
func (q *Queue) Subscribe(ctx context.Context) <-chan Event {
	ch := make(chan Event, subBuffer)
	q.mu.Lock()
	q.subs[ch] = struct{}{}
	q.mu.Unlock()
	context.AfterFunc(ctx, func() {
		q.mu.Lock()
		delete(q.subs, ch)
		q.mu.Unlock()
		close(ch)
	})
	return ch
}

// +checklocks:q.mu
func (q *Queue) publishLocked(ev Event) {
	for ch := range q.subs {
		select {
		case ch <- ev:
		default:
			q.dropped.Add(1)
		}
	}
}

// Stats returns the counters.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	n := len(q.byID)
	q.mu.Unlock()
	return Stats{Pending: n, Asked: q.asked.Load(), Joined: q.joined.Load(), Refused: q.refused.Load(),
		Allowed: q.allowed.Load(), Denied: q.denied.Load(), TimedOut: q.timedOut.Load(), Dropped: q.dropped.Load()}
}

func newID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(errors.Join(errors.New("approvals: no randomness"), err))
	}
	return "apr_" + hex.EncodeToString(b[:])
}
