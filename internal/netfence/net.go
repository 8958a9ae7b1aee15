package netfence

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/netattach"
)

// ErrNotAttached is returned by Net.DialSandbox while no namespace is
// attached (a gVisor sandbox between runs, or one not yet started); it
// wraps netattach.ErrPaused (isolation.ErrPaused).
var ErrNotAttached = fmt.Errorf("no network attached: %w", netattach.ErrPaused)

// Net is one sandbox's fence as its owner keeps it: the policy and egress
// proxy in force, and the stacks of the namespaces attached to it (one at
// a time in the steady state; two while a sandbox replaced under the same
// ID, a rewind's, is still being released). It implements
// netattach.Network.
type Net struct {
	f *Fence

	mu sync.Mutex
	// +checklocks:mu
	pol *policy.Policy
	// +checklocks:mu
	proxy *egress.Proxy
	// +checklocks:mu
	links []*link // attached last at the end
	// +checklocks:mu
	attaches int
}

var _ netattach.Network = (*Net)(nil)

// New returns a Net of f with policy pol (nil: deny all until SetPolicy)
// and no namespace attached. f must have its defaults (WithDefaults).
func (f *Fence) New(pol *policy.Policy) *Net {
	return &Net{f: f, pol: pol}
}

// Attach implements netattach.Network: it attaches nsPath with the policy
// and proxy in force.
func (n *Net) Attach(ctx context.Context, id, nsPath string, kernelPeer bool) (netattach.Link, error) {
	n.mu.Lock()
	defer n.mu.Unlock() // the policy cannot change between the stack's start and its listing
	st, err := n.f.Attach(ctx, id, nsPath, kernelPeer, n.pol)
	if err != nil {
		return nil, err
	}
	if n.proxy != nil {
		st.SetProxy(n.proxy)
	}
	l := &link{n: n, st: st}
	n.links = append(n.links, l)
	n.attaches++
	return l, nil
}

// SetPolicy replaces the policy (nil: deny all) of every attached
// namespace, and of those attached later.
func (n *Net) SetPolicy(p *policy.Policy) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pol = p
	if p == nil {
		p = DenyAll
	}
	for _, l := range n.links {
		l.st.SetPolicy(p)
	}
}

// Policy returns the policy in force (nil: deny all).
func (n *Net) Policy() *policy.Policy {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pol
}

// SetProxy makes the sandbox's allowed TCP flows go through p (nil:
// directly) from their next connection on.
func (n *Net) SetProxy(p *egress.Proxy) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.proxy = p
	for _, l := range n.links {
		l.st.SetProxy(p)
	}
}

// Proxy returns the egress proxy in force.
func (n *Net) Proxy() *egress.Proxy {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proxy
}

// Attached returns how many namespaces are attached now, and how many
// were ever.
func (n *Net) Attached() (now, ever int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.links), n.attaches
}

// DialSandbox connects to TCP port inside the sandbox through the stack
// of the namespace attached last; with none, an error wrapping
// ErrNotAttached.
func (n *Net) DialSandbox(ctx context.Context, port uint16) (net.Conn, error) {
	n.mu.Lock()
	var st *egress.Stack
	if len(n.links) > 0 {
		st = n.links[len(n.links)-1].st
	}
	n.mu.Unlock()
	if st == nil {
		return nil, fmt.Errorf("dialing sandbox port %d: %w", port, ErrNotAttached)
	}
	return st.DialSandbox(ctx, port)
}

// link is one attached namespace of a Net.
type link struct {
	n    *Net
	st   *egress.Stack
	once sync.Once
}

// EndFlows ends the egress flows open now of every namespace attached
// (egress.Stack.EndFlows).
func (n *Net) EndFlows() {
	n.mu.Lock()
	links := append([]*link(nil), n.links...)
	n.mu.Unlock()
	for _, l := range links {
		l.st.EndFlows()
	}
}

// DialSandbox implements netattach.Link.
func (l *link) DialSandbox(ctx context.Context, port uint16) (net.Conn, error) {
	return l.st.DialSandbox(ctx, port)
}

// errClosed is what a second Close of a link returns.
var errClosed = errors.New("network link already closed")

// Close implements netattach.Link: the stack leaves its Net (no policy
// change reaches it any more) and closes.
func (l *link) Close() error {
	err := errClosed
	l.once.Do(func() {
		l.n.mu.Lock()
		l.n.links = slices.DeleteFunc(l.n.links, func(o *link) bool { return o == l })
		l.n.mu.Unlock()
		err = l.st.Close()
	})
	return err
}
