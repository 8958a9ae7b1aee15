package sandbox

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
)

// What the lifecycle keeps of filesystem layers: the boot of a sandbox
// on a layer (a snapshot's, a fork's checkpoint, a rewind's, a
// filesystem-only pause's), the filesystem-only pause itself, and the
// seam to the keeper of layers (internal/sandbox/timetravel), which owns
// snapshots, forks, checkpoints, rewinds, diffs, standbys, the layer lock
// and the layer collector. The keeper reaches the lifecycle through
// LayerPort and Live, which New hands it (LayerKeeper.Bind); the
// lifecycle reaches the keeper through LayerKeeper (Options.Keeper).

// LayerKeeper is what the lifecycle asks of the keeper of layers
// (*timetravel.Keeper). The Manager never calls it holding its own lock.
type LayerKeeper interface {
	// Bind gives the keeper the lifecycle it serves. New calls it once,
	// before the Manager is returned; a keeper serves one Manager.
	Bind(p *LayerPort)
	// Origin resolves a create's template to the snapshot it names, nil
	// when it names none (ordinary templates first).
	Origin(ctx context.Context, ref string) (*Origin, error)
	// Hold takes the layer lock for reading: no layer is collected until
	// release is called. Whatever makes, records or boots on a layer
	// holds it until the layer is recorded or used.
	Hold() (release func())
	// CheckpointFiles freezes box's filesystem alone into a new layer
	// (a filesystem-only pause). The caller holds the layer lock.
	CheckpointFiles(ctx context.Context, box isolation.Sandbox) (isolation.LayerInfo, error)
	// Release tells the keeper that sandbox id is paused, killed or gone:
	// nothing will rewind it meanwhile (its standby is killed).
	Release(id string)
	// Collect asks for a collection of the layers that nothing keeps.
	Collect()
}

// noKeeper is the LayerKeeper of a Manager without one: no snapshots,
// no collection (nothing makes layers but filesystem-only pauses, which
// it refuses).
type noKeeper struct{}

func (noKeeper) Bind(*LayerPort)                                 {}
func (noKeeper) Origin(context.Context, string) (*Origin, error) { return nil, nil }
func (noKeeper) Hold() func()                                    { return func() {} }
func (noKeeper) Release(string)                                  {}
func (noKeeper) Collect()                                        {}
func (noKeeper) CheckpointFiles(context.Context, isolation.Sandbox) (isolation.LayerInfo, error) {
	return isolation.LayerInfo{}, fmt.Errorf("filesystem-only pauses need a keeper of layers, which this daemon has not: %w", api.ErrUnimplemented)
}

// NoLayers is the error of a layer operation on a backend that keeps no
// filesystem layers; it wraps api.ErrUnimplemented.
func NoLayers(backend string) error {
	return fmt.Errorf("snapshots, forks, checkpoints and filesystem-only pauses need filesystem layers, which the %s backend does not keep: %w", backend, api.ErrUnimplemented)
}

// Origin is the layer a sandbox boots on instead of its template alone:
// a snapshot's, or a fork's checkpoint.
type Origin struct {
	Layer    string
	Template string // the template under the layer
	Shown    string // the TemplateID the sandbox shows, if not the request's
	Alias    string // the Alias it shows with Shown
	// Memory is set for a layer that keeps memory (LayerInfo.Memory):
	// the template's start command runs in it already.
	Memory  bool
	Backend string // a snapshot's source's metadata fence.backend
	// Env is a snapshot's source's agent environment: the new sandbox's
	// environment is the create's on top of it.
	Env map[string]string
	// Parent, for a fork: its network, environment and secret bindings
	// are kept (the placeholders its files may hold stay valid).
	Parent *Live
}

func (o *Origin) origin() *origin {
	if o == nil {
		return nil
	}
	from := &origin{layer: o.Layer, template: o.Template, shown: o.Shown, alias: o.Alias, memory: o.Memory,
		backend: o.Backend, env: o.Env}
	if o.Parent != nil {
		from.parent = o.Parent.e
	}
	return from
}

// originOf resolves a create's template through k.
func originOf(ctx context.Context, k LayerKeeper, ref string) (*origin, error) {
	o, err := k.Origin(ctx, ref)
	if err != nil {
		return nil, err
	}
	return o.origin(), nil
}

// LayerPort is the lifecycle as the keeper of layers reaches it: the live
// sandboxes, the creates on a layer, the admission of a standby and the
// layers the lifecycle keeps. It holds no state of its own; New makes
// the Manager's and binds its keeper to it (LayerKeeper.Bind).
type LayerPort struct{ m *Manager }

// Backend is the backend's name (for errors).
func (p *LayerPort) Backend() string { return p.m.backend.Name() }

// Layers are the filesystem layers sandboxes boot on; nil when the
// backend keeps none (Options.Layers).
func (p *LayerPort) Layers() isolation.Layers { return p.m.layers }

// MaxSandboxes is the cap on sandboxes running or being created.
func (p *LayerPort) MaxSandboxes() int { return p.m.max }

// CheckTimeout checks a requested timeout as a create does.
func (p *LayerPort) CheckTimeout(d time.Duration) error { return checkTimeout(d, p.m.maxTimeout) }

// Live returns live (running or paused) sandbox id; unknown and killed
// ones give an error wrapping api.ErrNotFound, and any after Shutdown
// ErrClosed.
func (p *LayerPort) Live(id string) (*Live, error) {
	e, err := p.m.lookup(id)
	if err != nil {
		return nil, err
	}
	return &Live{p.m, e}, nil
}

// Create starts a sandbox on from's layer, as Create does on a template.
func (p *LayerPort) Create(ctx context.Context, req CreateRequest, from *Origin) (*Sandbox, error) {
	return p.m.create(ctx, req, from.origin())
}

// AdmitAhead reports whether one more sandbox started ahead of demand (a
// standby) leaves the headroom Options.Capacity keeps for creates.
func (p *LayerPort) AdmitAhead() bool {
	return p.m.adm.admitAhead()
}

// KeptLayers lists the layers the lifecycle keeps: each live sandbox's
// boot layer, filesystem-only pause and the layers its backend sandbox
// holds (isolation.LayerHolder), and the templates' run images.
func (p *LayerPort) KeptLayers() []string {
	m := p.m
	keep := m.runImages.Layers()
	var boxes []isolation.Sandbox
	m.mu.Lock()
	for _, e := range m.running {
		e.mu.Lock()
		keep = append(keep, e.layer, e.cold)
		e.mu.Unlock()
		boxes = append(boxes, e.sb())
	}
	m.mu.Unlock()
	for _, box := range boxes {
		if h, ok := isolation.As[isolation.LayerHolder](box); ok {
			keep = append(keep, h.HeldLayers()...)
		}
	}
	return keep
}

// Live is one live sandbox as the keeper of layers sees it.
type Live struct {
	m *Manager
	e *entry
}

// ID is the sandbox's ID.
func (l *Live) ID() string { return l.e.sb().ID() }

// Box is its current backend sandbox.
func (l *Live) Box() isolation.Sandbox { return l.e.sb() }

// Info returns a copy of its record.
func (l *Live) Info() *Sandbox { return l.e.snapshot() }

// Running reports whether it runs (is not paused).
func (l *Live) Running() bool { return l.e.state() == StateRunning }

// Lock serialises the caller with the sandbox's pause, resume, rewind and
// other layer operations; Unlock ends it.
//
// +checklocksignore: a wrapper of e.life, which guards no field.
func (l *Live) Lock() { l.e.life.Lock() }

// Unlock releases Lock.
//
// +checklocksignore: a wrapper of e.life, which guards no field.
func (l *Live) Unlock() { l.e.life.Unlock() }

// Current reports whether it is still live under a Manager not shut down
// (not killed since it was found).
func (l *Live) Current() bool {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	return !l.m.closed && l.m.running[l.ID()] == l.e
}

// Spec is what its backend sandbox was made with (the agent's final
// environment included).
func (l *Live) Spec() isolation.Spec { return l.e.spec }

// BaseTemplate is the template under its layers.
func (l *Live) BaseTemplate() string { return l.e.baseTemplate }

// AutoCheckpoint reports whether it is checkpointed before every command.
func (l *Live) AutoCheckpoint() bool { return l.e.autoCheckpoint }

// Layers are the layers of its filesystem: as created (created, "" for a
// template), the one its backend sandbox booted on (boot), and that of
// its filesystem-only pause (cold, "" unless paused so).
func (l *Live) Layers() (created, boot, cold string) {
	l.e.mu.Lock()
	defer l.e.mu.Unlock()
	return l.e.createdLayer, l.e.layer, l.e.cold
}

// MarkCheckpointed records that a checkpoint or snapshot of it keeps a
// layer (its kill then asks for a collection).
func (l *Live) MarkCheckpointed() { l.e.checkpointed.Store(true) }

// StandbySpec is the spec of a standby of it: its own, in the background,
// with a network that denies everything until the standby is handed
// over (under key).
func (l *Live) StandbySpec(key string) isolation.Spec {
	spec := l.e.spec
	spec.ID = l.ID()
	spec.Background, spec.Standby = true, true
	spec.Network = l.m.fences.Standby(key) // deny-all until the hand-over
	return spec
}

// Reboot replaces its backend sandbox by a new one, under the same ID, on
// layer: the one standby returns (a standby booted ahead on layer, with
// its fence's key), handed over (reporting true), else one booted now.
// Traffic meanwhile finds it paused (the proxy's 502). If the new one
// cannot start, the sandbox is killed. The caller holds Lock and the
// layer lock.
func (l *Live) Reboot(ctx context.Context, layer string, standby func(context.Context) (isolation.Sandbox, string)) (bool, error) {
	m, e := l.m, l.e
	id := e.sb().ID()
	old := e.sb()
	e.setBox(parkedBox{id})
	e.mu.Lock()
	nc := e.net
	running := e.info.State == StateRunning
	if running {
		close(e.runDone)
		e.runDone = make(chan struct{})
	}
	e.mu.Unlock()
	if _, ok := old.(parkedBox); !ok {
		killBox(ctx, m.log, old)
	}
	spec := e.spec
	spec.ID = id
	var err error
	box, key := standby(ctx)
	handed := box != nil
	if box != nil {
		if err = handOver(m.fences, box, key, nc); err != nil {
			m.log.WarnContext(ctx, "handing a standby over; booting anew", "sandbox_id", id, "err", err)
			killBox(ctx, m.log, box)
			box, handed = nil, false
		}
	}
	if box == nil {
		box, err = bootOn(ctx, m.fences, m.layers, spec, nc, layer)
	}
	if err != nil {
		m.log.ErrorContext(ctx, "rebooting sandbox failed; killing it", "sandbox_id", id, "err", err)
		_ = m.kill(ctx, id, "reboot failed")
		return false, fmt.Errorf("rebooting sandbox %s: %w", id, err)
	}
	e.mu.Lock()
	e.layer = layer
	e.mu.Unlock()
	e.setBox(box)
	return handed, l.stillLive(ctx, box)
}

// handOver makes a standby the sandbox: its fence becomes the sandbox's,
// with the network nc (its proxy first, then its policy), and it gets the
// ordinary CPU weight.
func handOver(fs *fences.Set, box isolation.Sandbox, key string, nc *netconf.Config) error {
	nw := fs.HandOver(box.ID(), key)
	if nw == nil {
		return fmt.Errorf("standby of %s has no network attached", box.ID())
	}
	fs.Apply(nw, nc, true)
	if f, ok := isolation.As[isolation.Foregrounder](box); ok {
		if err := f.Foreground(); err != nil {
			return err
		}
	}
	return nil
}

// stillLive kills box, just set as the sandbox's, if the sandbox was
// killed meanwhile (Kill does not wait for a reboot): whichever comes
// second kills it.
func (l *Live) stillLive(ctx context.Context, box isolation.Sandbox) error {
	m := l.m
	m.mu.Lock()
	cur := m.running[box.ID()]
	m.mu.Unlock()
	if cur != l.e {
		killBox(ctx, m.log, box)
		return notFound(box.ID())
	}
	return nil
}

// bootOn starts a backend sandbox for spec on layers' layer, with the
// compiled network nc on fs (a sandbox already under its ID, a reboot's,
// keeps the fence it has, and its policy).
func bootOn(ctx context.Context, fs *fences.Set, layers isolation.Layers, spec isolation.Spec, nc *netconf.Config, layer string) (isolation.Sandbox, error) {
	spec.Network = fs.Network(nc.Policy, nc.Proxy)
	return layers.CreateOn(ctx, spec, layer)
}

// usesLayers reports whether e kept layers (its records or its boot).
func (e *entry) usesLayers() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.layer != "" || e.cold != "" || e.checkpointed.Load()
}

// coldKeptPaused reports whether e is in a filesystem-only pause whose
// resume the store keeps.
func (e *entry) coldKeptPaused() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.info.State == StatePaused && e.cold != "" && e.coldKept
}

func (e *entry) isCold() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cold != ""
}

// parkedBox stands for a sandbox with no backend sandbox: paused without
// memory, or between the two halves of a reboot.
type parkedBox struct{ id string }

var _ isolation.Sandbox = parkedBox{}

func (p parkedBox) ID() string { return p.id }
func (p parkedBox) DialAgent(context.Context) (net.Conn, error) {
	return nil, fmt.Errorf("dialing agent: %w", isolation.ErrPaused)
}
func (p parkedBox) DialPort(context.Context, uint16) (net.Conn, error) {
	return nil, fmt.Errorf("dialing sandbox port: %w", isolation.ErrPaused)
}
func (p parkedBox) Stats(context.Context) (isolation.Stats, error) { return isolation.Stats{}, nil }
func (p parkedBox) Kill(context.Context) error                     { return nil }
func (p parkedBox) Done() <-chan struct{}                          { return nil }

// coldLayer is the layer of e's filesystem-only pause, "" if none.
func (e *entry) coldLayer() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cold
}
