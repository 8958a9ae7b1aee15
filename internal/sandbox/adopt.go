package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/sandbox/usage"
	"github.com/fencesandbox/fence/internal/store"
)

// adopter takes over, at Start, the sandboxes a previous daemon left
// paused: on a backend whose paused sandboxes outlive their daemon
// (isolation.Adopter, e.g. gVisor's checkpoint images; adopt), and
// filesystem-only pauses whose resume the store keeps (adoptCold). It
// reaches the Manager only through adoptCore.
type adopter struct {
	backend isolation.Adopter // nil: the backend adopts nothing
	layers  isolation.Layers  // nil: no filesystem-only pauses
	cold    *coldKeeper
	meter   *usage.Meter
	timeout time.Duration // the default create timeout
	now     func() time.Time
	log     *slog.Logger
	core    adoptCore
}

// adoptCore is what adoption needs of the Manager: the sandboxes'
// network fence, gateway and registry.
type adoptCore interface {
	// denyAll is a network on the Manager's fence that lets nothing
	// through, for a backend sandbox being adopted.
	denyAll() isolation.Network
	compileNetwork(ctx context.Context, r netconf.Request) (*netconf.Config, error)
	// setGateway gives sandbox id's egress gateway its configuration.
	setGateway(id string, nc *netconf.Config, bindings []gateway.Binding)
	// takeOver makes e, the paused sandbox id a previous daemon left
	// (box, or a parkedBox), one of the Manager's, its fence set to e's
	// network, and watches it.
	takeOver(ctx context.Context, id string, e *entry, box isolation.Sandbox)
}

// adopt takes over a sandbox a previous daemon left paused, on a backend
// whose paused sandboxes outlive their daemon (isolation.Adopter). It
// reports whether the sandbox is live again, paused, under this Manager;
// if not, the caller marks it killed and the backend's Cleanup removes
// what is left.
//
// The sandbox keeps its ID, envd access token, metadata, limits and
// network (recompiled from the stored configuration), and, from the resume
// data the pause recorded (cold.go), its agent configuration, secret
// bindings, egress proxy password, traffic token, lifecycle and create
// timeout. A record without that data (a pause of an older daemon) comes
// back with those at their defaults: autoPause and autoResume off, no
// secret bindings (their placeholders pass unreplaced).
func (a *adopter) adopt(ctx context.Context, rec *store.Sandbox) bool {
	if a.backend == nil || rec.State != store.StatePaused {
		return false
	}
	// Its fence is the Manager's (takeOver holds it), deny-all until the
	// network is compiled below.
	box, err := a.backend.Adopt(ctx, rec.ID, a.core.denyAll())
	if err != nil {
		if !errors.Is(err, isolation.ErrNotFound) {
			a.log.WarnContext(ctx, "adopting a paused sandbox", "sandbox_id", rec.ID, "err", err)
		}
		return false
	}
	cr, haveCR := a.cold.open(ctx, rec)
	if haveCR && cr.Layer != "" {
		haveCR = false // a filesystem-only pause's: not this one
	}
	req := netconf.Request{AllowInternetAccess: rec.AllowInternetAccess, Network: rec.Network}
	if haveCR {
		req = netconf.Request{AllowInternetAccess: cr.AllowInternetAccess, Network: cr.Network}
	}
	nc, err := a.core.compileNetwork(ctx, req)
	if err == nil && box.ID() != rec.ID {
		err = errors.New("the backend adopted another sandbox")
	}
	if err != nil {
		a.log.WarnContext(ctx, "adopting a paused sandbox", "sandbox_id", rec.ID, "err", err)
		killBox(ctx, a.log, box)
		return false
	}
	a.core.setGateway(rec.ID, nc, cr.Bindings)
	a.core.takeOver(ctx, rec.ID, a.pausedEntry(ctx, rec, nc, cr, haveCR), box)
	a.log.InfoContext(ctx, "paused sandbox left by a previous daemon adopted", "sandbox_id", rec.ID)
	return true
}

// adoptCold takes over a sandbox a previous daemon left in a
// filesystem-only pause, from its record's resume data. It reports
// whether the sandbox is live again, paused, under this Manager; if not,
// the caller marks it killed (and gc removes its layer).
func (a *adopter) adoptCold(ctx context.Context, rec *store.Sandbox) bool {
	if a.layers == nil {
		return false
	}
	cr, ok := a.cold.open(ctx, rec)
	if !ok {
		return false
	}
	warn := func(err error) bool {
		a.log.WarnContext(ctx, "taking over a sandbox paused without memory", "sandbox_id", rec.ID, "err", err)
		return false
	}
	if cr.Layer == "" { // a pause with memory its backend did not keep
		return false
	}
	layers, err := a.layers.ListLayers(ctx)
	if err != nil {
		return warn(err)
	}
	if !slices.ContainsFunc(layers, func(l isolation.LayerInfo) bool { return l.ID == cr.Layer }) {
		return warn(fmt.Errorf("its layer %q is gone", cr.Layer))
	}
	if st, err := os.Stat(cr.Spec.RootFS); err != nil || !st.IsDir() {
		return warn(fmt.Errorf("its template root %q is gone", cr.Spec.RootFS))
	}
	nc, err := a.core.compileNetwork(ctx, netconf.Request{AllowInternetAccess: cr.AllowInternetAccess, Network: cr.Network})
	if err != nil {
		return warn(err)
	}
	a.core.setGateway(rec.ID, nc, cr.Bindings)
	a.core.takeOver(ctx, rec.ID, a.pausedEntry(ctx, rec, nc, cr, true), parkedBox{rec.ID})
	a.log.InfoContext(ctx, "sandbox paused without memory by a previous daemon taken over", "sandbox_id", rec.ID)
	return true
}

// pausedEntry is the entry of paused sandbox rec taken over with network
// nc: its record's fields, and, when haveCR, those of the resume data cr
// its pause recorded (a filesystem-only pause's, cr.Layer set, is parked
// on that layer; one with memory's backend sandbox booted on
// cr.BootLayer).
func (a *adopter) pausedEntry(ctx context.Context, rec *store.Sandbox, nc *netconf.Config, cr coldRecord, haveCR bool) *entry {
	info := &Sandbox{
		ID: rec.ID, TemplateID: rec.Template, Alias: rec.Alias, State: StatePaused,
		StartedAt: rec.CreatedAt, EndAt: rec.EndAt, Metadata: maps.Clone(rec.Metadata),
		CPUs: rec.CPUs, MemoryMB: rec.MemoryMB, DiskMB: rec.DiskMB,
		EnvdAccessToken: rec.EnvdAccessToken, AllowInternetAccess: rec.AllowInternetAccess,
		Network: rec.Network, Team: rec.Team,
	}
	if info.Metadata == nil {
		info.Metadata = map[string]string{}
	}
	runDone := make(chan struct{})
	close(runDone) // its run ended with the pause
	e := &entry{info: info, net: nc, timeout: a.timeout, runDone: runDone,
		use: a.meter.Start(audit.ActorFrom(ctx), a.now(), true)}
	e.team = rec.Team
	if !haveCR {
		return e
	}
	info.TrafficAccessToken, info.MaskRequestHost = cr.TrafficAccessToken, cr.MaskRequestHost
	info.AutoPause, info.AutoResume, info.AutoPauseNoMemory, info.AutoCheckpoint = cr.AutoPause, cr.AutoResume, cr.AutoPauseNoMemory, cr.AutoCheckpoint
	e.spec, e.baseTemplate, e.createdLayer, e.autoCheckpoint = cr.Spec, cr.BaseTemplate, cr.CreatedLayer, cr.AutoCheckpoint
	info.IdleTimeout, e.idlePaused, e.idleLeft = cr.IdleTimeout, cr.IdlePaused, cr.IdleLeft // +checklocksignore: e is not shared yet
	if cr.Layer != "" {
		e.cold, e.coldKept = cr.Layer, true // +checklocksignore: e is not shared yet
	} else {
		e.layer = cr.BootLayer // +checklocksignore: e is not shared yet
	}
	e.checkpointed.Store(true) // its checkpoints, if any, are still recorded
	if cr.Timeout > 0 {
		e.timeout = cr.Timeout
	}
	return e
}

// adoptHost is the Manager as its adopter reaches it.
type adoptHost struct{ m *Manager }

var _ adoptCore = adoptHost{}

func (h adoptHost) denyAll() isolation.Network { return h.m.fences.Network(nil, nil) }

func (h adoptHost) compileNetwork(ctx context.Context, r netconf.Request) (*netconf.Config, error) {
	return h.m.fences.Compile(ctx, r)
}

func (h adoptHost) setGateway(id string, nc *netconf.Config, bindings []gateway.Binding) {
	h.m.fences.SetGateway(id, nc, bindings)
}

// takeOver holds the sandbox's fence from here, with e's network: a
// resume attaches the new namespace to it.
func (h adoptHost) takeOver(ctx context.Context, id string, e *entry, box isolation.Sandbox) {
	m := h.m
	e.mu.Lock()
	nc := e.net
	info := e.info.clone()
	e.mu.Unlock()
	m.fences.Apply(m.fences.Own(id, nil, nil), nc, true)
	e.setBox(box)
	m.mu.Lock()
	m.running[id] = e
	if info.IdleTimeout > 0 {
		m.idleable[id] = e
	}
	m.adm.adopt()
	m.quota.Adopt(id, recordTeam(info), quotaSize(info), info.State == StatePaused)
	m.wg.Go(func() { m.watch(e) })
	m.mu.Unlock()
}

// newAdopter returns m's adopter.
func newAdopter(m *Manager) *adopter {
	a := &adopter{layers: m.layers, cold: m.cold, meter: m.usage, timeout: m.defaults.Timeout,
		now: m.now, log: m.log, core: adoptHost{m}}
	a.backend, _ = isolation.As[isolation.Adopter](m.backend)
	return a
}
