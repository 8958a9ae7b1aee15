package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/store"
)

// A filesystem-only pause outlives its daemon: the store keeps, with the
// paused record, what its resume boots with (coldRecord), sealed (it holds
// the sandbox's environment, secret placeholders and egress proxy
// password), and the next Start takes the sandbox over, paused, from it
// (adoptCold). A pause with memory on a backend that keeps paused
// sandboxes on disk (isolation.Keeper: gvisor) keeps the same record, with
// no layer, so that the sandbox its backend adopts at Start comes back
// with its configuration too (adopt). Its layer is kept by the adopted entry like any paused
// sandbox's. A crash before the record is written leaves a running record
// (marked killed at Start; the new layer goes with the gc); after, a
// paused record with its data and a complete layer. A record whose data
// does not open, or whose layer or template is gone, is marked killed and
// its layer collected.

// Sealer encrypts what the Manager keeps in the store but must not hold in
// plaintext (environments); *secrets.Store implements it.
type Sealer interface {
	Seal(ctx context.Context, purpose string, data []byte) ([]byte, error)
	Unseal(ctx context.Context, purpose string, sealed []byte) ([]byte, error)
}

// ColdStore is the persistence of filesystem-only pauses; *store.Store
// implements it.
type ColdStore interface {
	PauseCold(ctx context.Context, id string, from store.State, startedAt, endAt time.Time, data []byte) error
	ColdResume(ctx context.Context, id string) ([]byte, error)
}

var _ ColdStore = (*store.Store)(nil)

// coldRecord is what the resume of a filesystem-only pause needs beyond
// the sandbox's record.
type coldRecord struct {
	Layer        string `json:"layer"`
	CreatedLayer string `json:"createdLayer,omitempty"`
	// BootLayer is the layer the paused backend sandbox booted on (a
	// pause with memory: it stays its).
	BootLayer    string         `json:"bootLayer,omitempty"`
	BaseTemplate string         `json:"baseTemplate"`
	Spec         isolation.Spec `json:"spec"` // without Egress: compiled again from Network
	Timeout      time.Duration  `json:"timeout"`
	// Layer is "" for a pause with memory (see above).
	// Network is the network in force (the egress proxy's password
	// included); AllowInternetAccess the create's.
	Network             *api.NetworkConfig `json:"network,omitempty"`
	AllowInternetAccess *bool              `json:"allowInternetAccess,omitempty"`
	Bindings            []gateway.Binding  `json:"bindings,omitempty"`
	TrafficAccessToken  string             `json:"trafficAccessToken,omitempty"`
	MaskRequestHost     string             `json:"maskRequestHost,omitempty"`
	AutoPause           bool               `json:"autoPause,omitempty"`
	AutoResume          bool               `json:"autoResume,omitempty"`
	AutoPauseNoMemory   bool               `json:"autoPauseNoMemory,omitempty"`
	AutoCheckpoint      bool               `json:"autoCheckpoint,omitempty"`
}

func coldPurpose(id string) string { return "sandbox-cold-resume:" + id }

// resumeRecord opens the resume data the store keeps for paused record
// rec; ok is false when there is none or it does not open.
func (m *Manager) resumeRecord(ctx context.Context, rec *store.Sandbox) (cr coldRecord, ok bool) {
	cs, isCold := m.store.(ColdStore)
	if !isCold || m.sealer == nil || rec.State != store.StatePaused {
		return cr, false
	}
	sealed, err := cs.ColdResume(ctx, rec.ID)
	if err != nil || len(sealed) == 0 {
		return cr, false
	}
	raw, err := m.sealer.Unseal(ctx, coldPurpose(rec.ID), sealed)
	if err == nil {
		err = json.Unmarshal(raw, &cr)
	}
	if err != nil {
		m.log.WarnContext(ctx, "opening the resume data of a paused sandbox", "sandbox_id", rec.ID, "err", err)
		return cr, false
	}
	return cr, true
}

// coldData is e's sealed coldRecord for its pause into layer; nil when
// the Manager has no Sealer (the pause then lasts as long as the daemon).
func (m *Manager) coldData(ctx context.Context, e *entry, layer string) ([]byte, error) {
	if m.sealer == nil {
		return nil, nil
	}
	id := e.sb().ID()
	spec := e.spec
	spec.ID, spec.Network, spec.Binds = "", nil, nil
	e.mu.Lock()
	cr := coldRecord{Layer: layer, CreatedLayer: e.createdLayer, BootLayer: e.layer, BaseTemplate: e.baseTemplate, Spec: spec, Timeout: e.timeout,
		AllowInternetAccess: e.info.AllowInternetAccess, TrafficAccessToken: e.info.TrafficAccessToken,
		MaskRequestHost: e.info.MaskRequestHost, AutoPause: e.info.AutoPause, AutoResume: e.info.AutoResume,
		AutoPauseNoMemory: e.info.AutoPauseNoMemory, AutoCheckpoint: e.info.AutoCheckpoint}
	if n := e.info.Network; n != nil {
		c := *n
		if c.EgressProxy != nil && e.net != nil && e.net.Proxy != nil {
			p := *c.EgressProxy
			p.Password = e.net.Proxy.Password
			c.EgressProxy = &p
		}
		cr.Network = &c
	}
	e.mu.Unlock()
	cr.Bindings = m.fences.Bindings(id)
	raw, err := json.Marshal(cr)
	if err != nil {
		return nil, err
	}
	return m.sealer.Seal(ctx, coldPurpose(id), raw)
}

// recordPause records e's pause (a move from state from to paused): a
// filesystem-only one into layer, or, with layer "", one with memory. It
// keeps what the resume needs after a restart of the daemon for a
// filesystem-only pause and for a backend sandbox that outlives the daemon
// paused (isolation.Keeper).
func (m *Manager) recordPause(ctx context.Context, e *entry, layer string, from store.State, startedAt, pausedAt time.Time) error {
	cs, ok := m.store.(ColdStore)
	if _, keeps := isolation.As[isolation.Keeper](e.sb()); !ok || (layer == "" && !keeps) {
		return m.store.Transition(ctx, e.sb().ID(), from, store.StatePaused, startedAt, pausedAt)
	}
	data, err := m.coldData(ctx, e, layer)
	if err != nil {
		// The pause still works; it lasts as long as this daemon.
		m.log.WarnContext(ctx, "sealing what the resume of a paused sandbox needs after a restart; it will not outlive the daemon",
			"sandbox_id", e.sb().ID(), "err", err)
		data = nil
	}
	if err := cs.PauseCold(ctx, e.sb().ID(), from, startedAt, pausedAt, data); err != nil {
		return err
	}
	e.mu.Lock()
	e.coldKept = len(data) > 0
	e.mu.Unlock()
	return nil
}

// adoptCold takes over a sandbox a previous daemon left in a
// filesystem-only pause, from its record's resume data. It reports
// whether the sandbox is live again, paused, under this Manager; if not,
// the caller marks it killed (and gc removes its layer).
func (m *Manager) adoptCold(ctx context.Context, rec *store.Sandbox) bool {
	if m.layers == nil {
		return false
	}
	cr, ok := m.resumeRecord(ctx, rec)
	if !ok {
		return false
	}
	warn := func(err error) bool {
		m.log.WarnContext(ctx, "taking over a sandbox paused without memory", "sandbox_id", rec.ID, "err", err)
		return false
	}
	if cr.Layer == "" { // a pause with memory its backend did not keep
		return false
	}
	layers, err := m.layers.ListLayers(ctx)
	if err != nil {
		return warn(err)
	}
	if !slices.ContainsFunc(layers, func(l isolation.LayerInfo) bool { return l.ID == cr.Layer }) {
		return warn(fmt.Errorf("its layer %q is gone", cr.Layer))
	}
	if st, err := os.Stat(cr.Spec.RootFS); err != nil || !st.IsDir() {
		return warn(fmt.Errorf("its template root %q is gone", cr.Spec.RootFS))
	}
	nc, err := m.fences.Compile(ctx, netconf.Request{AllowInternetAccess: cr.AllowInternetAccess, Network: cr.Network})
	if err != nil {
		return warn(err)
	}
	clock := m.now()
	info := &Sandbox{
		ID: rec.ID, TemplateID: rec.Template, Alias: rec.Alias, State: StatePaused,
		StartedAt: rec.CreatedAt, EndAt: rec.EndAt, Metadata: maps.Clone(rec.Metadata),
		CPUs: rec.CPUs, MemoryMB: rec.MemoryMB, DiskMB: rec.DiskMB,
		EnvdAccessToken: rec.EnvdAccessToken, AllowInternetAccess: rec.AllowInternetAccess,
		Network: rec.Network, TrafficAccessToken: cr.TrafficAccessToken, MaskRequestHost: cr.MaskRequestHost,
		AutoPause: cr.AutoPause, AutoResume: cr.AutoResume, AutoPauseNoMemory: cr.AutoPauseNoMemory,
		AutoCheckpoint: cr.AutoCheckpoint,
	}
	if info.Metadata == nil {
		info.Metadata = map[string]string{}
	}
	runDone := make(chan struct{})
	close(runDone) // its run ended with the pause
	e := &entry{info: info, net: nc, timeout: cr.Timeout, runDone: runDone, spec: cr.Spec,
		createdLayer: cr.CreatedLayer, baseTemplate: cr.BaseTemplate, autoCheckpoint: cr.AutoCheckpoint,
		use: m.usage.Start(audit.ActorFrom(ctx), clock, true), cold: cr.Layer, coldKept: true}
	if e.timeout <= 0 {
		e.timeout = m.defaults.Timeout
	}
	e.checkpointed.Store(true) // its checkpoints, if any, are still recorded
	m.fences.SetGateway(rec.ID, nc, cr.Bindings)
	m.takeOver(ctx, rec.ID, e, parkedBox{rec.ID}, "sandbox paused without memory by a previous daemon taken over")
	return true
}
