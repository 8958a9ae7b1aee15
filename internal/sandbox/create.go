package sandbox

import (
	"context"
	"fmt"
	"maps"
	"net"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/sandbox/startup"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

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

// creating is one create in progress: what its steps decided and made.
// Its steps run in order, each on what the ones before it left; a step
// that fails after the backend made the sandbox kills it, and undo takes
// back the rest, so that a failed create leaves nothing behind.
type creating struct {
	m    *Manager
	req  CreateRequest
	from *origin

	tmpl    string  // the template under the sandbox
	rt      Runtime // the template's runtime (its size, environment, start)
	timeout time.Duration
	limits  isolation.Limits
	backend string          // the backend the spec names
	nc      *netconf.Config // the network it gets
	rootfs  string

	phEnv    map[string]string // secrets' placeholders, in its environment
	bindings []gateway.Binding // its secrets' bindings, for its gateway
	spec     isolation.Spec
	imageKey string // the template's run image it may boot on ("" for none)
	restored bool   // booted on that run image: its start command runs
	box      isolation.Sandbox
	id       string
	hold     *tenancy.Hold // its room in its team's quota

	// What undo takes back.
	fenced bool // the Manager owns its fence (and, once stored, its gateway state)
}

// create starts a sandbox for req (on from, if not nil): it is checked
// and planned, then admitted, booted, made ready, recorded and
// registered, in that order. See the package doc for its guarantees.
func (m *Manager) create(ctx context.Context, req CreateRequest, from *origin) (*Sandbox, error) {
	c := &creating{m: m, req: req, from: from}
	if err := c.plan(ctx); err != nil {
		return nil, err
	}
	if err := c.admitTeam(ctx); err != nil {
		return nil, err
	}
	if err := m.adm.reserve(ctx); err != nil {
		c.hold.Cancel()
		return nil, err
	}
	registered := false
	defer func() {
		if !registered {
			c.undo()
		}
	}()
	if err := c.configure(ctx); err != nil {
		return nil, err
	}
	if err := c.boot(ctx); err != nil {
		return nil, err
	}
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	clock := m.now()
	info := c.sandbox(clock.UTC())
	info.Team = tenancy.TeamOf(ctx)
	if err := c.record(ctx, info); err != nil {
		return nil, err
	}
	e := &entry{info: info, net: c.nc, timeout: c.timeout, runDone: make(chan struct{}),
		use: m.usage.Start(audit.ActorFrom(ctx), clock, false), spec: c.spec, autoCheckpoint: c.req.AutoCheckpoint}
	e.setBox(c.box)
	e.team = info.Team
	e.baseTemplate = c.tmpl
	if from != nil {
		e.layer, e.createdLayer = from.layer, from.layer // +checklocksignore: e is not shared yet
	}
	m.mu.Lock()
	registered = true
	if m.closed {
		m.adm.cancel()
		c.hold.Cancel()
		m.mu.Unlock()
		killBox(ctx, m.log, c.box)
		markKilled(ctx, m.store, m.log, c.id)
		return nil, ErrClosed
	}
	m.running[c.id] = e
	if info.IdleTimeout > 0 {
		m.idleable[c.id] = e
	}
	m.adm.register()
	c.hold.Commit(c.id)
	m.wg.Go(func() { m.watch(e) })
	m.mu.Unlock()
	m.reaper.nudgeAt(info.EndAt)

	m.record(ctx, audit.TypeCreate, c.id, createRecord(c.req, info))
	m.log.InfoContext(ctx, "sandbox created", "sandbox_id", c.id, "template", info.TemplateID,
		"end_at", info.EndAt)
	return info.clone(), nil
}

// plan checks the request and decides what the sandbox gets (template,
// size, timeout, backend, network, root), changing nothing but the
// templates on the node (Fetcher).
func (c *creating) plan(ctx context.Context) error {
	m, from := c.m, c.from
	c.tmpl = c.req.TemplateID
	if from != nil {
		c.tmpl = from.template
	}
	if f, ok := m.templates.(Fetcher); ok && from == nil {
		if err := f.Fetch(ctx, c.tmpl); err != nil {
			return fmt.Errorf("template %q: %w", c.tmpl, err)
		}
	}
	if r, ok := m.templates.(Runtimer); ok {
		c.rt, _ = r.Runtime(c.tmpl)
	}
	// A built template's size is its sandboxes' unless the request says.
	if c.req.CPUs == 0 {
		c.req.CPUs = c.rt.CPUs
	}
	if c.req.MemoryMB == 0 {
		c.req.MemoryMB = c.rt.MemoryMB
	}
	var err error
	if c.timeout, c.limits, err = validate(c.req, m.defaults, m.maxTimeout); err != nil {
		return err
	}
	if from != nil && from.backend != "" && c.req.Metadata[BackendMetadataKey] == "" {
		// A sandbox made from a snapshot runs on the snapshot's backend:
		// its metadata says so, as its source's did.
		c.req.Metadata = maps.Clone(c.req.Metadata)
		if c.req.Metadata == nil {
			c.req.Metadata = map[string]string{}
		}
		c.req.Metadata[BackendMetadataKey] = from.backend
	}
	if c.backend, err = backendFor(m.backend, c.req); err != nil {
		return err
	}
	if c.req.AutoPauseNoMemory && m.layers == nil {
		return fmt.Errorf("autoPauseMemory false: the %s backend cannot pause without memory: %w", m.backend.Name(), api.ErrUnimplemented)
	}
	if from != nil && from.parent != nil {
		// A fork keeps its parent's network exactly as it is now (updates
		// included) and its secret bindings.
		from.parent.mu.Lock()
		c.nc = from.parent.net
		from.parent.mu.Unlock()
	} else if c.nc, err = m.fences.Compile(ctx, netconf.Request{AllowInternetAccess: c.req.AllowInternetAccess,
		Network: c.req.Network, Secrets: c.req.Secrets, EnvVars: c.req.EnvVars}); err != nil {
		return err
	}
	if rf, ok := m.templates.(ResolverFor); ok {
		c.rootfs, err = rf.ResolveFor(ctx, c.tmpl)
	} else {
		c.rootfs, err = m.templates.Resolve(c.tmpl)
	}
	if err != nil {
		return fmt.Errorf("resolving template %q: %w", c.tmpl, err)
	}
	return nil
}

// configure binds the sandbox's secrets and makes its gateway state, its
// agent's environment and the spec the backend boots.
func (c *creating) configure(ctx context.Context) error {
	// The backend names the sandbox (a pool in front of it may hand out
	// one started earlier, named then).
	var err error
	if c.from != nil && c.from.parent != nil {
		c.bindings = c.m.fences.Bindings(c.from.parent.sb().ID())
	} else if c.phEnv, c.bindings, err = c.m.fences.BindSecrets(ctx, c.nc.Bindings); err != nil {
		return err
	}
	env := c.req.EnvVars
	var base map[string]string // a snapshot's environment, under the request's
	if c.from != nil {
		base = c.from.env
	}
	if len(base)+len(c.m.caEnv)+len(c.phEnv)+len(c.rt.Env) > 0 {
		env = maps.Clone(base)
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, c.m.caEnv)
		maps.Copy(env, c.rt.Env) // the template's defaults; the request wins
		maps.Copy(env, c.req.EnvVars)
		maps.Copy(env, c.phEnv)
	}
	c.spec = isolation.Spec{
		Backend: c.backend,
		RootFS:  c.rootfs,
		Limits:  c.limits,
		Agent:   isolation.AgentConfig{EnvVars: env, DefaultUser: c.rt.DefaultUser, DefaultWorkdir: c.rt.DefaultWorkdir},
		Binds:   c.req.Volumes,
	}
	if c.from == nil {
		c.imageKey = runImageKey(c.spec, c.rt, c.req, c.phEnv)
	}
	return nil
}

// boot has the backend make the sandbox (on its origin's layer, on the
// template's run image, or anew) and checks that it can do what the
// request asks of it.
func (c *creating) boot(ctx context.Context) error {
	m := c.m
	var err error
	if c.from != nil {
		if c.from.parent != nil {
			c.spec.Agent.EnvVars = c.from.parent.spec.Agent.EnvVars
		}
		c.box, err = bootOn(ctx, m.fences, m.layers, c.spec, c.nc, c.from.layer)
	} else if c.box = m.runImages.Boot(ctx, c.imageKey, c.spec, c.nc); c.box != nil {
		c.restored = true
	} else {
		c.spec.Network = m.fences.Network(c.nc.Policy, c.nc.Proxy)
		c.box, err = m.backend.Create(ctx, c.spec)
	}
	if err != nil {
		return fmt.Errorf("creating sandbox: %w", err)
	}
	c.id = c.box.ID()
	if !api.ValidSandboxID(c.id) {
		return c.kill(ctx, fmt.Errorf("creating sandbox: backend named it %q", c.id))
	}
	if _, ok := isolation.As[isolation.Checkpointer](c.box); c.req.AutoPauseNoMemory && (!ok || m.layers == nil) {
		return c.kill(ctx, fmt.Errorf("autoPauseMemory false: the %s backend cannot pause without memory: %w", m.backend.Name(), api.ErrUnimplemented))
	}
	if _, ok := isolation.As[isolation.Pauser](c.box); c.req.AutoPause && !ok {
		return c.kill(ctx, fmt.Errorf("autoPause: the %s backend cannot pause sandboxes: %w", m.backend.Name(), api.ErrUnimplemented))
	}
	return nil
}

// ready takes the sandbox's fence, waits for the template's ready ports,
// stores its gateway state and runs the template's start command.
func (c *creating) ready(ctx context.Context) error {
	m, id, nc := c.m, c.id, c.nc
	// The Manager holds the sandbox's fence from here. Its Net was made
	// with nc at the Attach, unless a warm pool made it (deny-all) for a
	// sandbox started ahead: that one takes nc now, before anything of
	// the request runs.
	if nw := m.fences.Own(id, nc.Policy, nc.Proxy); nw.Policy() != nc.Policy || nw.Proxy() != nc.Proxy {
		m.fences.Apply(nw, nc, nw.Proxy() != nc.Proxy)
	}
	c.fenced = true
	// A layer with memory goes on where its source was: its services and
	// start command run already.
	resumed := c.from != nil && c.from.memory
	if rp, ok := m.templates.(ReadyPorter); ok && !resumed {
		if err := startup.WaitPorts(ctx, m.log, id, func(ctx context.Context, port uint16) (net.Conn, error) {
			return m.fences.Dial(ctx, id, port)
		}, c.tmpl, rp.ReadyPorts(c.tmpl)); err != nil {
			return c.kill(ctx, fmt.Errorf("creating sandbox: %w", err))
		}
	}
	m.fences.SetGateway(id, nc, c.bindings)
	// Start and ready commands run once the sandbox's egress gateway knows
	// it; a sandbox restored from a run image has them running already.
	if !c.restored && !resumed {
		if err := m.starts.Start(ctx, c.box, c.tmpl, c.rt); err != nil {
			return c.kill(ctx, fmt.Errorf("creating sandbox: %w", err))
		}
		m.runImages.Keep(ctx, c.imageKey, c.box)
	}
	return nil
}

// sandbox is the Manager's view of the new sandbox, started at now.
func (c *creating) sandbox(now time.Time) *Sandbox {
	req, from := c.req, c.from
	info := &Sandbox{
		ID:                  c.id,
		TemplateID:          req.TemplateID, // the template's ID, a snapshot's, or a fork's source's: below
		State:               StateRunning,
		StartedAt:           now,
		EndAt:               now.Add(c.timeout),
		Metadata:            req.Metadata,
		CPUs:                c.limits.CPUs,
		MemoryMB:            c.limits.MemoryBytes >> 20,
		DiskMB:              c.limits.DiskBytes >> 20,
		EnvdAccessToken:     newToken(),
		AllowInternetAccess: req.AllowInternetAccess,
		Network:             c.nc.Shown,
		AutoPause:           req.AutoPause,
		AutoResume:          req.AutoResume,
		AutoPauseNoMemory:   req.AutoPauseNoMemory,
		AutoCheckpoint:      req.AutoCheckpoint,
		IdleTimeout:         c.m.defaults.IdleTimeout,
	}
	if req.IdleTimeout != nil {
		info.IdleTimeout = *req.IdleTimeout
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
		if idr, ok := c.m.templates.(Identifier); ok {
			if tid, alias, ok := idr.Identity(req.TemplateID); ok {
				info.TemplateID, info.Alias = tid, alias
			}
		}
	}
	if from != nil && from.parent != nil {
		info.Network = req.Network // the parent's, as it shows it
	}
	return info
}

// record writes the sandbox's record to the store.
func (c *creating) record(ctx context.Context, info *Sandbox) error {
	slot := 0
	if s, ok := isolation.As[interface{ Slot() int }](c.box); ok {
		slot = s.Slot()
	}
	rec := &store.Sandbox{
		ID: c.id, Template: info.TemplateID, Alias: info.Alias, State: store.StateRunning,
		CreatedAt: info.StartedAt, EndAt: info.EndAt, Metadata: info.Metadata,
		CPUs: info.CPUs, MemoryMB: info.MemoryMB, DiskMB: info.DiskMB,
		EnvdAccessToken: info.EnvdAccessToken, AllowInternetAccess: info.AllowInternetAccess,
		Network: info.Network, Slot: slot, Team: info.Team,
	}
	// The store write must not be abandoned half-way because the client left.
	if err := c.m.store.Insert(context.WithoutCancel(ctx), rec); err != nil {
		return c.kill(ctx, fmt.Errorf("recording sandbox %s: %w", c.id, err))
	}
	return nil
}

// kill kills the sandbox the backend made, for a step that failed with
// err, and returns err.
func (c *creating) kill(ctx context.Context, err error) error {
	killBox(ctx, c.m.log, c.box)
	return err
}

// undo takes back what the steps made of a create that failed before its
// sandbox was registered (the sandbox itself is killed by the step that
// failed): its fence and gateway state, its unit of admission.
func (c *creating) undo() {
	if c.fenced {
		c.m.fences.Drop(c.id)
	}
	c.m.adm.cancel()
	c.hold.Cancel()
}
