package sandbox

import (
	"context"
	"errors"

	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/store"
)

// adopt takes over a sandbox a previous daemon left paused, on a backend
// whose paused sandboxes outlive their daemon (isolation.Adopter, e.g.
// gVisor's checkpoint images). It reports whether the sandbox is live
// again, paused, under this Manager; if not, the caller marks it killed
// and the backend's Cleanup removes what is left.
//
// The sandbox keeps its ID, envd access token, metadata, limits and
// network (recompiled from the stored configuration), and, from the resume
// data the pause recorded (cold.go), its agent configuration, secret
// bindings, egress proxy password, traffic token, lifecycle and create
// timeout. A record without that data (a pause of an older daemon) comes
// back with those at their defaults: autoPause and autoResume off, no
// secret bindings (their placeholders pass unreplaced).
func (m *Manager) adopt(ctx context.Context, rec *store.Sandbox) bool {
	a, ok := isolation.As[isolation.Adopter](m.backend)
	if !ok || rec.State != store.StatePaused {
		return false
	}
	// Its fence is the Manager's (takeOver holds it), deny-all until the
	// network is compiled below.
	box, err := a.Adopt(ctx, rec.ID, m.fences.network(nil, nil))
	if err != nil {
		if !errors.Is(err, isolation.ErrNotFound) {
			m.log.WarnContext(ctx, "adopting a paused sandbox", "sandbox_id", rec.ID, "err", err)
		}
		return false
	}
	cr, haveCR := m.resumeRecord(ctx, rec)
	if haveCR && cr.Layer != "" {
		haveCR = false // a filesystem-only pause's: not this one
	}
	req := netconf.Request{AllowInternetAccess: rec.AllowInternetAccess, Network: rec.Network}
	if haveCR {
		req = netconf.Request{AllowInternetAccess: cr.AllowInternetAccess, Network: cr.Network}
	}
	nc, err := m.compileNetwork(ctx, req)
	if err == nil && box.ID() != rec.ID {
		err = errors.New("the backend adopted another sandbox")
	}
	if err != nil {
		m.log.WarnContext(ctx, "adopting a paused sandbox", "sandbox_id", rec.ID, "err", err)
		m.killBox(ctx, box)
		return false
	}
	gw := &gatewayState{}
	gw.cfg.Store(m.gatewayConfig(nc, cr.Bindings))
	m.gateways.Store(rec.ID, gw)
	clock := m.now()
	info := &Sandbox{
		ID: rec.ID, TemplateID: rec.Template, Alias: rec.Alias, State: StatePaused,
		StartedAt: rec.CreatedAt, EndAt: rec.EndAt, Metadata: rec.Metadata,
		CPUs: rec.CPUs, MemoryMB: rec.MemoryMB, DiskMB: rec.DiskMB,
		EnvdAccessToken: rec.EnvdAccessToken, AllowInternetAccess: rec.AllowInternetAccess,
		Network: rec.Network,
	}
	if info.Metadata == nil {
		info.Metadata = map[string]string{}
	}
	runDone := make(chan struct{})
	close(runDone) // its run ended with the pause
	e := &entry{info: info, net: nc, timeout: m.defaults.Timeout, runDone: runDone,
		use: m.usage.Start(audit.ActorFrom(ctx), clock, true)}
	if haveCR {
		info.TrafficAccessToken, info.MaskRequestHost = cr.TrafficAccessToken, cr.MaskRequestHost
		info.AutoPause, info.AutoResume, info.AutoPauseNoMemory, info.AutoCheckpoint = cr.AutoPause, cr.AutoResume, cr.AutoPauseNoMemory, cr.AutoCheckpoint
		e.spec, e.baseTemplate, e.createdLayer, e.autoCheckpoint = cr.Spec, cr.BaseTemplate, cr.CreatedLayer, cr.AutoCheckpoint
		e.layer = cr.BootLayer
		e.checkpointed.Store(true) // its checkpoints, if any, are still recorded
		if cr.Timeout > 0 {
			e.timeout = cr.Timeout
		}
	}
	m.takeOver(ctx, rec.ID, e, box, "paused sandbox left by a previous daemon adopted")
	return true
}

// takeOver makes e, the paused sandbox id a previous daemon left (box, or a
// parkedBox), one of this daemon's and watches it.
//
// The Manager holds the sandbox's fence from here, with e's network: a
// resume attaches the new namespace to it.
func (m *Manager) takeOver(ctx context.Context, id string, e *entry, box isolation.Sandbox, msg string) {
	e.mu.Lock()
	nc := e.net
	e.mu.Unlock()
	applyNetwork(m.fences.own(id, nil, nil), nc, true)
	e.setBox(box)
	m.mu.Lock()
	m.running[id] = e
	m.adm.adopt()
	m.wg.Go(func() { m.watch(e) })
	m.mu.Unlock()
	m.log.InfoContext(ctx, msg, "sandbox_id", id)
}
