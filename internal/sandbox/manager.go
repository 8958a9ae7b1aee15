package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/capacity"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/netfence"
	"github.com/fencesandbox/fence/internal/sandbox/usage"
	"github.com/fencesandbox/fence/internal/store"
)

// Store is the persistence the Manager needs; *store.Store implements it.
type Store interface {
	Insert(ctx context.Context, sb *store.Sandbox) error
	List(ctx context.Context, f store.Filter) ([]*store.Sandbox, error)
	UpdateEndAt(ctx context.Context, id string, endAt time.Time) error
	SetState(ctx context.Context, id string, st store.State) error
	Transition(ctx context.Context, id string, from, to store.State, startedAt, endAt time.Time) error
	DeleteKilledBefore(ctx context.Context, t time.Time) (int64, error)
}

var _ Store = (*store.Store)(nil)

// Templates resolves a template name to its root directory. Unknown names
// give an error wrapping api.ErrNotFound.
type Templates interface {
	Resolve(name string) (rootfs string, err error)
}

// Identifier is implemented by Templates that know a template's ID and
// alias apart (a built template may be named by alias, alias:tag or ID):
// a sandbox shows the ID as its TemplateID and the alias as its Alias.
type Identifier interface {
	Identity(name string) (id, alias string, ok bool)
}

// Defaults are the resources and timeout of a sandbox whose create request
// does not name them. Zero fields take the built-in values in brackets.
type Defaults struct {
	CPUs     float64       // [isolation.DefaultLimits]
	MemoryMB int64         // [isolation.DefaultLimits]
	Pids     int64         // [isolation.DefaultLimits]
	DiskMB   int64         // [isolation.DefaultLimits]
	NoFile   uint64        // [isolation.DefaultLimits]
	Timeout  time.Duration // [5m]
}

func (d Defaults) withBuiltins() Defaults {
	b := isolation.DefaultLimits
	if d.CPUs == 0 {
		d.CPUs = b.CPUs
	}
	if d.MemoryMB == 0 {
		d.MemoryMB = b.MemoryBytes >> 20
	}
	if d.Pids == 0 {
		d.Pids = b.Pids
	}
	if d.DiskMB == 0 {
		d.DiskMB = b.DiskBytes >> 20
	}
	if d.NoFile == 0 {
		d.NoFile = b.NoFile
	}
	if d.Timeout == 0 {
		d.Timeout = 5 * time.Minute
	}
	return d
}

// Limits returns d's resource limits in the backends' type; zero fields
// stay zero (the backend's defaults apply).
func (d Defaults) Limits() isolation.Limits {
	return isolation.Limits{
		CPUs: d.CPUs, MemoryBytes: d.MemoryMB << 20, Pids: d.Pids, DiskBytes: d.DiskMB << 20, NoFile: d.NoFile,
	}
}

// Options configure a Manager.
type Options struct {
	Backend   isolation.Backend // required
	Store     Store             // required
	Templates Templates         // required
	Defaults  Defaults
	// MaxSandboxes caps sandboxes running or being created; 0 means 1000.
	MaxSandboxes int
	// MaxTimeout is the longest timeout a request may ask for; 0 means 24h.
	MaxTimeout time.Duration
	// KilledRetention is how long killed records stay in the store before
	// Start prunes them; 0 means 24h.
	KilledRetention time.Duration
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
	// Audit, if set, receives the lifecycle events (create, kill and why).
	Audit audit.Sink
	// InspectByDefault makes the egress gateway intercept every
	// name-allowed TLS flow of a sandbox whose network says nothing about
	// inspection (fence serve --inspect).
	InspectByDefault bool
	// Secrets, if set, is checked for the secrets a create binds.
	Secrets gateway.Secrets
	// Sealer, if set, seals what the store keeps of a filesystem-only
	// pause (its environment among it), which then outlives the daemon;
	// without it such a pause lasts as long as the daemon.
	Sealer Sealer
	// CAEnv are variables every sandbox gets (under its own envVars) so
	// that its tools trust the egress gateway's CA.
	CAEnv map[string]string
	// Layers, if set, keeps the filesystem layers of snapshots, forks,
	// checkpoints and filesystem-only pauses; nil means the backend's own
	// if it implements isolation.Layers (a warm pool in front of it does
	// not: pass the backend).
	Layers isolation.Layers
	// SampleEvery is how often each sandbox's resource use is recorded
	// for metrics over a time range; 0 means 5 seconds.
	SampleEvery time.Duration
	// Keeper, if set, keeps snapshots, forks, checkpoints, rewinds and
	// the collection of layers (internal/sandbox/timetravel); without it
	// no create names a snapshot and no filesystem-only pause is made.
	Keeper LayerKeeper
	// Fence is the sandboxes' network fence (resolver, host addresses,
	// flow records, bandwidth, gateway); zero fields take netfence's
	// defaults. The Manager owns each sandbox's fence: backends attach
	// their namespaces to it (isolation.Spec.Network).
	Fence netfence.Fence
	// Capacity, if set, admits each create (forks and restores included)
	// against the host's limits before anything starts, counting the
	// creates in flight; sandboxes started ahead of demand (warm pools,
	// standbys) leave capacity.PoolReserve creates' worth of headroom.
	Capacity *capacity.Gate
	// Logger; nil discards logs.
	Logger *slog.Logger
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// ErrClosed is returned by calls made after Shutdown. It wraps
// api.ErrUnavailable.
var ErrClosed = fmt.Errorf("sandbox manager is shut down: %w", api.ErrUnavailable)

var errNotStarted = fmt.Errorf("sandbox manager is not started: %w", api.ErrUnavailable)

// Manager owns the lifecycle of sandboxes.
type Manager struct {
	backend   isolation.Backend
	store     Store
	templates Templates
	defaults  Defaults

	allowInternetByDefault bool
	inspectByDefault       bool
	audit                  audit.Sink
	layers                 isolation.Layers
	keeper                 LayerKeeper // snapshots, checkpoints, layer collection (layers.go)
	runImages              runImages   // templates' run images (runimage.go)
	secrets                gateway.Secrets
	sealer                 Sealer
	caEnv                  map[string]string
	// warmTemplates holds the templates a warm pool prepares (WarmTarget).
	warmTemplates sync.Map // string → bool
	// gateways holds each handed-out sandbox's *gatewayState, by ID.
	gateways  sync.Map
	hostAddrs []netip.Addr
	hosts     policy.HostSet
	never     []netip.Prefix
	max       int
	capacity  *capacity.Gate // nil admits anything the count allows
	// admitMu serialises admissions, so that each sees the creates
	// admitted before it in pending.
	admitMu    sync.Mutex
	maxTimeout time.Duration
	retention  time.Duration
	log        *slog.Logger
	now        func() time.Time

	netMu  sync.Mutex // serialises UpdateNetwork
	fences *fences    // each sandbox's network fence, by ID (fence.go)

	wake chan struct{} // nudges the reaper; buffered 1
	stop chan struct{} // closed by Shutdown
	// wakeMu guards what a nudge tells the reaper: a deadline set since
	// it last looked (the earliest), or that it must look at them all.
	wakeMu sync.Mutex
	// +checklocks:wakeMu
	wakeAt time.Time
	// +checklocks:wakeMu
	wakeRescan bool

	sampleEvery time.Duration
	wg          sync.WaitGroup

	mu sync.Mutex
	// +checklocks:mu
	started bool
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	running map[string]*entry
	// +checklocks:mu
	pending int // creates between the capacity check and registration
	// +checklocks:mu
	pooled int // sandboxes started ahead of demand (PoolBudget units)
	// +checklocks:mu
	dying int // sandboxes out of running whose kill has not returned yet

	usage *usage.Meter // usage accounting (usage.go)
}

// New returns a Manager. Call Start before using it.
func New(opts Options) (*Manager, error) {
	if opts.Backend == nil || opts.Store == nil || opts.Templates == nil {
		return nil, errors.New("sandbox.New: Backend, Store and Templates are required")
	}
	m := &Manager{
		backend:                opts.Backend,
		store:                  opts.Store,
		templates:              opts.Templates,
		defaults:               opts.Defaults.withBuiltins(),
		allowInternetByDefault: opts.AllowInternetByDefault,
		inspectByDefault:       opts.InspectByDefault,
		audit:                  opts.Audit,
		layers:                 opts.Layers,
		keeper:                 opts.Keeper,
		secrets:                opts.Secrets,
		sealer:                 opts.Sealer,
		caEnv:                  opts.CAEnv,
		hostAddrs:              opts.HostAddrs,
		hosts:                  opts.Hosts,
		never:                  opts.NeverCIDRs,
		max:                    opts.MaxSandboxes,
		capacity:               opts.Capacity,
		maxTimeout:             opts.MaxTimeout,
		retention:              opts.KilledRetention,
		log:                    opts.Logger,
		now:                    opts.Now,
		wake:                   make(chan struct{}, 1),
		fences:                 newFences(opts.Fence, opts.Logger),
		stop:                   make(chan struct{}),
		sampleEvery:            cmp.Or(opts.SampleEvery, 5*time.Second),
		running:                map[string]*entry{},
	}
	m.usage = usage.NewMeter(opts.Audit, liveUsage{m})
	if m.max <= 0 {
		m.max = 1000
	}
	if m.layers == nil {
		m.layers, _ = opts.Backend.(isolation.Layers)
	}
	if m.keeper == nil {
		m.keeper = noKeeper{}
	}
	if m.maxTimeout <= 0 {
		m.maxTimeout = 24 * time.Hour
	}
	if m.retention <= 0 {
		m.retention = 24 * time.Hour
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.now == nil {
		m.now = time.Now
	}
	if m.defaults.Timeout > m.maxTimeout {
		return nil, fmt.Errorf("sandbox.New: default timeout %v exceeds MaxTimeout %v", m.defaults.Timeout, m.maxTimeout)
	}
	return m, nil
}

// Start recovers from a crash and starts the reaper: every sandbox the store
// says is running is marked killed, then Backend.Cleanup removes whatever
// the previous daemon left on the host.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.started || m.closed {
		m.mu.Unlock()
		return errors.New("sandbox manager: Start called twice or after Shutdown")
	}
	m.mu.Unlock()

	// Paused sandboxes are frozen processes of the previous daemon: they
	// do not survive it either, unless the backend keeps them on disk
	// (isolation.Adopter), which adopts them before its Cleanup, or they
	// were paused without memory and the store keeps what their resume
	// needs (cold.go).
	stale, err := m.store.List(ctx, store.Filter{States: []store.State{store.StateRunning, store.StatePaused}})
	if err != nil {
		return fmt.Errorf("recovering sandboxes: %w", err)
	}
	for _, s := range stale {
		if m.adopt(ctx, s) || m.adoptCold(ctx, s) {
			continue
		}
		if err := m.store.SetState(ctx, s.ID, store.StateKilled); err != nil {
			return fmt.Errorf("recovering sandbox %s: %w", s.ID, err)
		}
		m.log.InfoContext(ctx, "sandbox left "+string(s.State)+" by a previous daemon marked killed", "sandbox_id", s.ID)
	}
	removed, err := m.backend.Cleanup(ctx)
	if err != nil {
		return fmt.Errorf("cleaning up backend %s: %w", m.backend.Name(), err)
	}
	if len(removed) > 0 {
		m.log.InfoContext(ctx, "backend cleaned up leftover sandboxes", "count", len(removed), "ids", removed)
	}
	if _, err := m.store.DeleteKilledBefore(ctx, m.now().Add(-m.retention)); err != nil {
		return fmt.Errorf("pruning old records: %w", err)
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.started = true
	m.wg.Go(m.reaper)
	m.wg.Go(m.sampler)
	return nil
}

// Create starts a sandbox. See the package doc for its guarantees.
// A TemplateID naming a snapshot boots the sandbox on it.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	from, err := originOf(ctx, m.keeper, req.TemplateID)
	if err != nil {
		return nil, err
	}
	return m.create(ctx, req, from)
}

// origin is where a sandbox that does not boot on its template alone
// comes from: a snapshot or a fork's checkpoint.
type origin struct {
	layer    string
	template string // the template under the layer
	shown    string // the TemplateID the sandbox shows, if not the request's
	alias    string // the Alias it shows with shown
	// memory is set for a layer that keeps memory (LayerInfo.Memory): the
	// template's start command runs in it already.
	memory  bool
	backend string // a snapshot's source's metadata fence.backend
	// env is a snapshot's source's agent environment: the new sandbox's
	// environment is the create's on top of it.
	env map[string]string
	// parent, for a fork: its environment and secret bindings are kept
	// (the placeholders its files may hold stay valid).
	parent *entry
}

func (m *Manager) create(ctx context.Context, req CreateRequest, from *origin) (*Sandbox, error) {
	tmplName := req.TemplateID
	if from != nil {
		tmplName = from.template
	}
	var rt Runtime
	if r, ok := m.templates.(Runtimer); ok {
		rt, _ = r.Runtime(tmplName)
	}
	// A built template's size is its sandboxes' unless the request says.
	if req.CPUs == 0 {
		req.CPUs = rt.CPUs
	}
	if req.MemoryMB == 0 {
		req.MemoryMB = rt.MemoryMB
	}
	timeout, limits, err := m.validate(req)
	if err != nil {
		return nil, err
	}
	if from != nil && from.backend != "" && req.Metadata[BackendMetadataKey] == "" {
		// A sandbox made from a snapshot runs on the snapshot's backend:
		// its metadata says so, as its source's did.
		req.Metadata = maps.Clone(req.Metadata)
		if req.Metadata == nil {
			req.Metadata = map[string]string{}
		}
		req.Metadata[BackendMetadataKey] = from.backend
	}
	backendName, err := m.backendFor(req)
	if err != nil {
		return nil, err
	}
	if req.AutoPauseNoMemory && m.layers == nil {
		return nil, fmt.Errorf("autoPauseMemory false: the %s backend cannot pause without memory: %w", m.backend.Name(), api.ErrUnimplemented)
	}
	var nc *netconf.Config
	if from != nil && from.parent != nil {
		// A fork keeps its parent's network exactly as it is now (updates
		// included) and its secret bindings.
		from.parent.mu.Lock()
		nc = from.parent.net
		from.parent.mu.Unlock()
	} else if nc, err = m.compileNetwork(ctx, netconf.Request{AllowInternetAccess: req.AllowInternetAccess,
		Network: req.Network, Secrets: req.Secrets, EnvVars: req.EnvVars}); err != nil {
		return nil, err
	}
	tmpl := req.TemplateID
	if from != nil {
		tmpl = from.template
	}
	rootfs, err := m.templates.Resolve(tmpl)
	if err != nil {
		return nil, fmt.Errorf("resolving template %q: %w", tmpl, err)
	}
	if err := m.reserve(ctx); err != nil {
		return nil, err
	}
	registered := false
	defer func() {
		if !registered {
			m.mu.Lock()
			m.pending--
			m.mu.Unlock()
		}
	}()

	// The backend names the sandbox (a pool in front of it may hand out
	// one started earlier, named then).
	var (
		phEnv    map[string]string
		bindings []gateway.Binding
	)
	if from != nil && from.parent != nil {
		if g := m.GatewayConfig(from.parent.sb().ID()); g != nil {
			bindings = g.Bindings
		}
	} else if phEnv, bindings, err = m.bindSecrets(ctx, nc.Bindings); err != nil {
		return nil, err
	}
	gw := &gatewayState{}
	gw.cfg.Store(m.gatewayConfig(nc, bindings))
	env := req.EnvVars
	var base map[string]string // a snapshot's environment, under the request's
	if from != nil {
		base = from.env
	}
	if len(base)+len(m.caEnv)+len(phEnv)+len(rt.Env) > 0 {
		env = maps.Clone(base)
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, m.caEnv)
		maps.Copy(env, rt.Env) // the template's defaults; the request wins
		maps.Copy(env, req.EnvVars)
		maps.Copy(env, phEnv)
	}
	spec := isolation.Spec{
		Backend: backendName,
		RootFS:  rootfs,
		Limits:  limits,
		Agent:   isolation.AgentConfig{EnvVars: env, DefaultUser: rt.DefaultUser, DefaultWorkdir: rt.DefaultWorkdir},
	}
	var box isolation.Sandbox
	imageKey := ""
	if from == nil {
		imageKey = runImageKey(spec, rt, req, phEnv)
	}
	restored := false // booted on a template's run image (runimage.go)
	if from != nil {
		if from.parent != nil {
			spec.Agent.EnvVars = from.parent.spec.Agent.EnvVars
		}
		box, err = m.bootOn(ctx, spec, nc, from.layer)
	} else if box = m.bootRunImage(ctx, imageKey, spec, nc); box != nil {
		restored = true
	} else {
		spec.Network = m.fences.network(nc.Policy, nc.Proxy)
		box, err = m.backend.Create(ctx, spec)
	}
	if err != nil {
		return nil, fmt.Errorf("creating sandbox: %w", err)
	}
	id := box.ID()
	if !api.ValidSandboxID(id) {
		m.killBox(ctx, box)
		return nil, fmt.Errorf("creating sandbox: backend named it %q", id)
	}
	if _, ok := isolation.As[isolation.Checkpointer](box); req.AutoPauseNoMemory && (!ok || m.layers == nil) {
		m.killBox(ctx, box)
		return nil, fmt.Errorf("autoPauseMemory false: the %s backend cannot pause without memory: %w", m.backend.Name(), api.ErrUnimplemented)
	}
	if _, ok := isolation.As[isolation.Pauser](box); req.AutoPause && !ok {
		m.killBox(ctx, box)
		return nil, fmt.Errorf("autoPause: the %s backend cannot pause sandboxes: %w", m.backend.Name(), api.ErrUnimplemented)
	}
	// The Manager holds the sandbox's fence from here. Its Net was made
	// with nc at the Attach, unless a warm pool made it (deny-all) for a
	// sandbox started ahead: that one takes nc now, before anything of
	// the request runs.
	if nw := m.fences.own(id, nc.Policy, nc.Proxy); nw.Policy() != nc.Policy || nw.Proxy() != nc.Proxy {
		applyNetwork(nw, nc, nw.Proxy() != nc.Proxy)
	}
	defer func() {
		if !registered {
			m.fences.drop(id)
		}
	}()
	// A layer with memory goes on where its source was: its services and
	// start command run already.
	resumed := from != nil && from.memory
	if rp, ok := m.templates.(ReadyPorter); ok && !resumed {
		if err := m.waitReady(ctx, id, func(ctx context.Context, port uint16) (net.Conn, error) {
			return m.fences.dial(ctx, id, port)
		}, tmplName, rp.ReadyPorts(tmplName)); err != nil {
			m.killBox(ctx, box)
			return nil, fmt.Errorf("creating sandbox: %w", err)
		}
	}
	m.gateways.Store(id, gw)
	defer func() {
		if !registered {
			m.gateways.Delete(id)
		}
	}()
	// Start and ready commands run once the sandbox's egress gateway knows
	// it; a sandbox restored from a run image has them running already.
	if !restored && !resumed {
		if err := m.startRuntime(ctx, box, tmplName, rt); err != nil {
			m.killBox(ctx, box)
			return nil, fmt.Errorf("creating sandbox: %w", err)
		}
		m.keepRunImage(ctx, imageKey, box)
	}
	clock := m.now()
	now := clock.UTC()
	info := &Sandbox{
		ID:                  id,
		TemplateID:          req.TemplateID, // the template's ID, a snapshot's, or a fork's source's: below
		State:               StateRunning,
		StartedAt:           now,
		EndAt:               now.Add(timeout),
		Metadata:            req.Metadata,
		CPUs:                limits.CPUs,
		MemoryMB:            limits.MemoryBytes >> 20,
		DiskMB:              limits.DiskBytes >> 20,
		EnvdAccessToken:     newToken(),
		AllowInternetAccess: req.AllowInternetAccess,
		Network:             nc.Shown,
		AutoPause:           req.AutoPause,
		AutoResume:          req.AutoResume,
		AutoPauseNoMemory:   req.AutoPauseNoMemory,
		AutoCheckpoint:      req.AutoCheckpoint,
	}
	if n := req.Network; n != nil {
		if n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic {
			info.TrafficAccessToken = newToken()
		}
		info.MaskRequestHost = n.MaskRequestHost
	}
	if info.Metadata == nil {
		info.Metadata = map[string]string{}
	}
	switch {
	case from != nil && from.shown != "":
		info.TemplateID, info.Alias = from.shown, from.alias
	case from == nil:
		if idr, ok := m.templates.(Identifier); ok {
			if tid, alias, ok := idr.Identity(req.TemplateID); ok {
				info.TemplateID, info.Alias = tid, alias
			}
		}
	}
	if from != nil && from.parent != nil {
		info.Network = req.Network // the parent's, as it shows it
	}
	slot := 0
	if s, ok := isolation.As[interface{ Slot() int }](box); ok {
		slot = s.Slot()
	}
	rec := &store.Sandbox{
		ID: id, Template: info.TemplateID, Alias: info.Alias, State: store.StateRunning,
		CreatedAt: info.StartedAt, EndAt: info.EndAt, Metadata: info.Metadata,
		CPUs: info.CPUs, MemoryMB: info.MemoryMB, DiskMB: info.DiskMB,
		EnvdAccessToken: info.EnvdAccessToken, AllowInternetAccess: info.AllowInternetAccess,
		Network: info.Network, Slot: slot,
	}
	// The store write must not be abandoned half-way because the client left.
	if err := m.store.Insert(context.WithoutCancel(ctx), rec); err != nil {
		m.killBox(ctx, box)
		return nil, fmt.Errorf("recording sandbox %s: %w", id, err)
	}

	e := &entry{info: info, net: nc, timeout: timeout, runDone: make(chan struct{}),
		use: m.usage.Start(audit.ActorFrom(ctx), clock, false), spec: spec, autoCheckpoint: req.AutoCheckpoint}
	e.setBox(box)
	e.baseTemplate = tmpl
	if from != nil {
		e.layer, e.createdLayer = from.layer, from.layer // +checklocksignore: e is not shared yet
	}
	m.mu.Lock()
	m.pending--
	registered = true
	if m.closed {
		m.mu.Unlock()
		m.killBox(ctx, box)
		m.markKilled(ctx, id)
		return nil, ErrClosed
	}
	m.running[id] = e
	m.wg.Go(func() { m.watch(e) })
	m.mu.Unlock()
	m.nudgeAt(info.EndAt)

	m.record(ctx, audit.TypeCreate, id, createRecord(req, info))
	m.log.InfoContext(ctx, "sandbox created", "sandbox_id", id, "template", info.TemplateID,
		"end_at", info.EndAt)
	return info.clone(), nil
}

// killBox kills a backend sandbox, even if ctx is already canceled.
func (m *Manager) killBox(ctx context.Context, box isolation.Sandbox) {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := box.Kill(kctx); err != nil {
		m.log.ErrorContext(ctx, "killing sandbox", "sandbox_id", box.ID(), "err", err)
	}
}

func (m *Manager) markKilled(ctx context.Context, id string) {
	if err := m.store.SetState(context.WithoutCancel(ctx), id, store.StateKilled); err != nil {
		m.log.ErrorContext(ctx, "marking sandbox killed", "sandbox_id", id, "err", err)
	}
}

// watch marks a sandbox killed when it stops on its own (not when a
// reboot replaced its backend sandbox).
func (m *Manager) watch(e *entry) {
	for {
		ref := e.boxp.Load()
		select {
		case <-ref.Done():
		case <-ref.replaced:
			continue
		case <-m.stop:
			return
		}
		if e.boxp.Load() == ref {
			break
		}
	}
	m.mu.Lock()
	cur, ok := m.running[e.sb().ID()]
	if ok && cur == e {
		delete(m.running, e.sb().ID())
		m.gateways.Delete(e.sb().ID())
		m.fences.drop(e.sb().ID())
		m.dying++
	}
	m.mu.Unlock()
	if ok && cur == e {
		ctx := context.Background()
		m.log.WarnContext(ctx, "sandbox stopped unexpectedly", "sandbox_id", e.sb().ID())
		m.record(ctx, audit.TypeKill, e.sb().ID(), map[string]any{"reason": "exited"})
		m.finishUsage(ctx, e)
		m.killRemoved(ctx, e.sb()) // release host resources the backend may still hold
		m.keeper.Release(e.sb().ID())
		m.markKilled(ctx, e.sb().ID())
		if e.usesLayers() {
			m.keeper.Collect()
		}
	}
}

// Shutdown kills every sandbox (but paused ones a backend keeps on disk,
// isolation.Keeper, and ones paused without memory whose resume the store
// keeps, which the next Start takes over) and stops the reaper. Later calls to the
// Manager fail with ErrClosed. It returns ctx.Err() if ctx ends first.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	all := make([]*entry, 0, len(m.running))
	for id, e := range m.running {
		all = append(all, e)
		delete(m.running, id)
		m.gateways.Delete(id)
		m.fences.drop(id)
	}
	m.mu.Unlock()
	close(m.stop)

	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for _, e := range all {
			m.keeper.Release(e.sb().ID())
			if k, ok := isolation.As[isolation.Keeper](e.sb()); (ok && e.state() == StatePaused && k.Kept()) || e.coldKeptPaused() {
				// Its state is on disk: the next daemon adopts it.
				m.log.InfoContext(ctx, "paused sandbox kept for the next start", "sandbox_id", e.sb().ID())
				continue
			}
			wg.Go(func() {
				m.finishUsage(ctx, e)
				m.killBox(ctx, e.sb())
				m.markKilled(ctx, e.sb().ID())
			})
		}
		wg.Wait()
		m.wg.Wait()
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
