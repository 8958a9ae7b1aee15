// Package fences is the network side of fence's sandboxes: each sandbox's
// network fence (one netfence.Net per sandbox ID), the compiling of a
// create's or update's network request, the egress gateway's view of each
// sandbox (its policy, header rules and secret bindings), and the
// runtime policy updates of PUT /sandboxes/{id}/network.
//
// A Set is made before the lifecycle core (sandbox.Manager), which uses it
// during a create, and is bound to the core once (Bind); it reaches the
// core only through the narrow Core interface declared here. Nothing the
// Set does calls up into the core during a create: a backend is handed
// the Net to attach its namespace to as a value (Network), and the egress
// gateway reads its per-sandbox configuration from the Set (Options.Gateway).
//
// # Guarantees
//
//   - A Net lives while the core holds its sandbox (Own until Drop) or a
//     namespace is attached to it, whichever ends last; a warm pool's
//     sandbox, started before the core knows it, has a deny-all one from
//     its create (Pool), which the create that takes it owns.
//   - A sandbox without a policy denies everything; a network update
//     swaps the egress proxy behind a deny-all, so no new flow takes the
//     old route under the new policy or the reverse.
//   - Bad network input is an error wrapping api.ErrInvalidArgument and
//     changes nothing.
//   - A sandbox the core has not handed out (a pooled one) has no gateway
//     configuration: the gateway intercepts nothing of it.
//   - All methods are safe for concurrent use; network updates are
//     serialised.
package fences

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/netfence"
)

// Options configure a Set.
type Options struct {
	// Fence is the sandboxes' network fence (resolver, host addresses,
	// flow records, bandwidth); zero fields take netfence's defaults.
	Fence netfence.Fence
	// Gateway, if set, is each sandbox's egress gateway: the Set gives
	// every sandbox's stack the gateway's interceptor, fed with the
	// sandbox's configuration as the Set keeps it (it replaces
	// Fence.Interceptor).
	Gateway Gateway
	// AllowInternetByDefault is the egress of a sandbox whose request says
	// nothing about its network: false (deny all, the default) or true
	// (every public address; never the host, link-local, metadata or
	// private ranges).
	AllowInternetByDefault bool
	// HostAddrs are the host's own addresses, never reachable from a
	// sandbox whatever its policy.
	HostAddrs []netip.Addr
	// Hosts, if set, is the live set of the host's own addresses
	// (internal/hostaddr), never reachable either, as it changes.
	Hosts policy.HostSet
	// NeverCIDRs are the operator's ranges that no sandbox may reach,
	// whatever its policy lists.
	NeverCIDRs []netip.Prefix
	// InspectByDefault makes the egress gateway intercept every
	// name-allowed TLS flow of a sandbox whose network says nothing about
	// inspection (fence serve --inspect).
	InspectByDefault bool
	// Secrets, if set, is checked for the secrets a create binds.
	Secrets gateway.Secrets
	// Approvals, if set, is asked about the names a sandbox with network
	// approval "ask" looks up and may not reach (see approval.go); nil
	// refuses them at once.
	Approvals Approvals
	// TeamNames, if set, keeps the names approved for whole teams
	// (teamnames.go); without it they last as long as the Set.
	TeamNames TeamNames
	// Budget, if set, is the teams' daily egress (budget.go): a spent
	// team's sandboxes' new TCP flows are refused and their open ones end.
	Budget Budget
	// Logger; nil discards logs.
	Logger *slog.Logger
}

// Gateway gives a sandbox's stack its egress gateway; *gateway.Gateway
// implements it.
type Gateway interface {
	ForSandbox(id string, cfg func() *gateway.Config) egress.Interceptor
}

var _ Gateway = (*gateway.Gateway)(nil)

// Core is the lifecycle core as the network side reaches it.
type Core interface {
	// Sandbox returns live sandbox id, or an error wrapping
	// api.ErrNotFound for an unknown or killed one.
	Sandbox(id string) (Sandbox, error)
	// AddEgress counts a flow's bytes in sandbox id's usage.
	AddEgress(id string, out, in int64)
	// Team returns the team of live sandbox id, false for none.
	Team(id string) (string, bool)
}

// Sandbox is what the lifecycle core keeps of one live sandbox's network.
type Sandbox interface {
	// Running reports whether it runs (is not paused).
	Running() bool
	// Network returns the compiled network it runs under.
	Network() *netconf.Config
	// SetNetwork makes nc its network and, under the same lock, sets what
	// it shows of it to what show returns, given what it shows now.
	SetNetwork(nc *netconf.Config, show ShowFunc)
}

// Set is the sandboxes' network side. Make one with New.
type Set struct {
	fence     *netfence.Fence
	defaults  netconf.Defaults
	inspect   bool
	secrets   gateway.Secrets
	approvals Approvals
	budget    Budget // nil: egress is not limited
	teamNames teamNames
	log       *slog.Logger
	core      Core // set once by Bind, before any sandbox is handed out

	updateMu sync.Mutex // serialises UpdateNetwork
	// gateways holds each handed-out sandbox's *gatewayState, by ID.
	gateways sync.Map

	mu sync.Mutex
	// +checklocks:mu
	byID map[string]*fenceRef
}

// New returns a Set.
func New(opts Options) *Set {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Set{
		defaults: netconf.Defaults{AllowInternet: opts.AllowInternetByDefault,
			HostAddrs: opts.HostAddrs, Hosts: opts.Hosts, Never: opts.NeverCIDRs},
		inspect:   opts.InspectByDefault,
		secrets:   opts.Secrets,
		approvals: opts.Approvals,
		budget:    opts.Budget,
		teamNames: teamNames{store: opts.TeamNames},
		log:       log,
		byID:      map[string]*fenceRef{},
	}
	f := opts.Fence
	if f.Logger == nil {
		f.Logger = log
	}
	if gw := opts.Gateway; gw != nil {
		f.Interceptor = func(id string) egress.Interceptor {
			return gw.ForSandbox(id, func() *gateway.Config { return s.GatewayConfig(id) })
		}
	}
	if opts.Approvals != nil {
		f.Ask = func(id string) func(context.Context, string) egress.Approval {
			return func(ctx context.Context, name string) egress.Approval { return s.ask(ctx, id, name) }
		}
	}
	if opts.Budget != nil {
		f.Admit = s.admitFor
	}
	f = f.WithDefaults()
	s.fence = &f
	return s
}

// Bind gives s the lifecycle core it reaches live sandboxes through
// (UpdateNetwork, DialPort) and counts their flows' bytes in (each flow
// is counted before the fence's own recorder gets it). It is called once,
// by the core's constructor, before any sandbox exists; a second call
// panics.
func (s *Set) Bind(c Core) {
	if s.core != nil {
		panic("fences: Set bound to a second core")
	}
	s.core = c
	s.fence.Recorder = usageRecorder{s: s, core: c, next: s.fence.Recorder}
}

// usageRecorder counts each flow's bytes against its sandbox in the
// core and its team's egress of the day, then hands the flow on.
type usageRecorder struct {
	s    *Set
	core Core
	next egress.Recorder
}

func (r usageRecorder) Record(ctx context.Context, ev egress.FlowEvent) {
	if ev.SandboxID != "" {
		r.core.AddEgress(ev.SandboxID, ev.BytesOut, ev.BytesIn)
	}
	r.next.Record(ctx, ev)
	if ev.SandboxID != "" {
		r.s.charge(ctx, ev.SandboxID, ev.BytesOut+ev.BytesIn)
	}
}

// fenceRef is one sandbox's Net and what keeps it.
type fenceRef struct {
	id    string // its key in byID; "" once a hand-over replaced it
	nw    *netfence.Net
	links int  // namespaces attached (or being attached)
	owned bool // held by the core
}

// Network returns the isolation.Network to create a sandbox with: its Net
// is made with policy pol and proxy (nil: deny all, directly) if the
// sandbox has none yet, as a new sandbox has not. The backend attaches the
// sandbox's namespace to it.
func (s *Set) Network(pol *policy.Policy, proxy *egress.Proxy) isolation.Network {
	return attacher{s: s, pol: pol, proxy: proxy}
}

// Pool is the network of sandboxes started ahead of their create (a warm
// pool's, warm.Target.Network): deny-all until the create that takes one
// gives it its network.
func (s *Set) Pool() isolation.Network { return s.Network(nil, nil) }

// refLocked returns id's fenceRef, made with pol and proxy if there is none.
//
// +checklocks:s.mu
func (s *Set) refLocked(id string, pol *policy.Policy, proxy *egress.Proxy) *fenceRef {
	r := s.byID[id]
	if r == nil {
		nw := s.fence.New(pol)
		if proxy != nil {
			nw.SetProxy(proxy)
		}
		r = &fenceRef{id: id, nw: nw}
		s.byID[id] = r
	}
	return r
}

// Own makes the core hold id's Net (made with pol and proxy if it has
// none) until Drop, and returns it.
func (s *Set) Own(id string, pol *policy.Policy, proxy *egress.Proxy) *netfence.Net {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.refLocked(id, pol, proxy)
	r.owned = true
	return r.nw
}

// Drop ends the core's hold on id's Net and forgets id's gateway
// configuration: the sandbox is gone.
func (s *Set) Drop(id string) {
	s.gateways.Delete(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.byID[id]; r != nil {
		r.owned = false
		s.releaseLocked(r)
	}
}

// +checklocks:s.mu
func (s *Set) releaseLocked(r *fenceRef) {
	if !r.owned && r.links == 0 && r.id != "" && s.byID[r.id] == r {
		delete(s.byID, r.id)
	}
}

// Standby returns the isolation.Network of a standby booted beside
// sandbox id: a Net of its own under key, deny-all, which nothing dials,
// until HandOver makes it id's.
func (s *Set) Standby(key string) isolation.Network {
	return attacher{s: s, key: key}
}

// HandOver makes the Net of the standby attached under key sandbox id's,
// held by the core as id's was; id's previous Net keeps only the
// namespaces attached to it (the replaced sandbox's, being released). The
// caller then gives it id's network (Apply). It returns nil if the
// standby attached nothing.
func (s *Set) HandOver(id, key string) *netfence.Net {
	s.mu.Lock()
	defer s.mu.Unlock()
	nr := s.byID[key]
	if nr == nil {
		return nil
	}
	delete(s.byID, key)
	if old := s.byID[id]; old != nil {
		nr.owned = old.owned
		old.owned, old.id = false, ""
	}
	nr.id = id
	s.byID[id] = nr
	return nr.nw
}

// Net returns the fence of sandbox id (nil if it has none): the policy
// and egress proxy in force, and the stack its ports are reached through.
func (s *Set) Net(id string) *netfence.Net {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.byID[id]; r != nil {
		return r.nw
	}
	return nil
}

// Dial connects to port inside sandbox id through its fence, whatever
// the core knows of it (a create waiting for its template's ports, before
// the sandbox is the core's).
func (s *Set) Dial(ctx context.Context, id string, port uint16) (net.Conn, error) {
	nw := s.Net(id)
	if nw == nil {
		return nil, fmt.Errorf("dialing sandbox port %d: %w", port, isolation.ErrNotFound)
	}
	return nw.DialSandbox(ctx, port)
}

// DialPort connects to TCP port inside running sandbox id, through its
// fence (ingress: the daemon's proxy). A paused sandbox gives an error
// wrapping isolation.ErrPaused, an unknown or killed one
// isolation.ErrNotFound.
func (s *Set) DialPort(ctx context.Context, id string, port uint16) (net.Conn, error) {
	sb, err := s.core.Sandbox(id)
	if err != nil {
		return nil, fmt.Errorf("dialing sandbox %s: %w", id, isolation.ErrNotFound)
	}
	if !sb.Running() {
		return nil, fmt.Errorf("dialing sandbox %s: %w", id, isolation.ErrPaused)
	}
	return s.Dial(ctx, id, port)
}

// attacher is the isolation.Network a backend is handed.
type attacher struct {
	s     *Set
	pol   *policy.Policy
	proxy *egress.Proxy
	key   string // the Net's key if not the sandbox's ID (a standby's)
}

// Attach implements isolation.Network.
func (a attacher) Attach(ctx context.Context, id, nsPath string, kernelPeer bool) (isolation.Link, error) {
	key := id
	if a.key != "" {
		key = a.key
	}
	a.s.mu.Lock()
	r := a.s.refLocked(key, a.pol, a.proxy)
	r.links++
	a.s.mu.Unlock()
	l, err := r.nw.Attach(ctx, id, nsPath, kernelPeer)
	if err != nil {
		a.unref(r)
		return nil, err
	}
	return &heldLink{Link: l, release: func() { a.unref(r) }}, nil
}

func (a attacher) unref(r *fenceRef) {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	r.links--
	a.s.releaseLocked(r)
}

// heldLink is a Link that lets go of its Net when closed.
type heldLink struct {
	isolation.Link
	once    sync.Once
	release func()
}

// Close implements isolation.Link.
func (l *heldLink) Close() error {
	err := l.Link.Close()
	l.once.Do(l.release)
	return err
}

// Len returns how many Nets s holds: the sandboxes' it owns and those
// namespaces are still attached to.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}
