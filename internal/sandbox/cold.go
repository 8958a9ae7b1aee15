package sandbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/store"
)

// A filesystem-only pause outlives its daemon: the store keeps, with the
// paused record, what its resume boots with (coldRecord), sealed (it holds
// the sandbox's environment, secret placeholders and egress proxy
// password), and the next Start takes the sandbox over, paused, from it
// (adopter.adoptCold). A pause with memory on a backend that keeps paused
// sandboxes on disk (isolation.Keeper: gvisor) keeps the same record, with
// no layer, so that the sandbox its backend adopts at Start comes back
// with its configuration too (adopter.adopt). Its layer is kept by the
// adopted entry like any paused sandbox's. The coldKeeper writes and reads
// that record. A crash before the record is written leaves a running record
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
	// IdleTimeout is the sandbox's; IdlePaused a pause for idleness, with
	// IdleLeft the time its deadline was ahead then.
	IdleTimeout time.Duration `json:"idleTimeout,omitempty"`
	IdlePaused  bool          `json:"idlePaused,omitempty"`
	IdleLeft    time.Duration `json:"idleLeft,omitempty"`
}

func coldPurpose(id string) string { return "sandbox-cold-resume:" + id }

// coldKeeper records pauses in the store, with the sealed coldRecord a
// resume after a restart needs, and opens those records again.
type coldKeeper struct {
	store  Store     // records every pause
	cold   ColdStore // nil: the store keeps no resume data
	sealer Sealer    // nil: no resume data is kept (pauses last as long as the daemon)
	log    *slog.Logger
	// bindings returns live sandbox id's secret bindings (its egress
	// gateway's).
	bindings func(id string) []gateway.Binding
}

func newColdKeeper(st Store, sealer Sealer, log *slog.Logger, bindings func(string) []gateway.Binding) *coldKeeper {
	cs, _ := st.(ColdStore)
	return &coldKeeper{store: st, cold: cs, sealer: sealer, log: log, bindings: bindings}
}

// open opens the resume data the store keeps for paused record rec; ok
// is false when there is none or it does not open.
func (k *coldKeeper) open(ctx context.Context, rec *store.Sandbox) (cr coldRecord, ok bool) {
	if k.cold == nil || k.sealer == nil || rec.State != store.StatePaused {
		return cr, false
	}
	sealed, err := k.cold.ColdResume(ctx, rec.ID)
	if err != nil || len(sealed) == 0 {
		return cr, false
	}
	raw, err := k.sealer.Unseal(ctx, coldPurpose(rec.ID), sealed)
	if err == nil {
		err = json.Unmarshal(raw, &cr)
	}
	if err != nil {
		k.log.WarnContext(ctx, "opening the resume data of a paused sandbox", "sandbox_id", rec.ID, "err", err)
		return cr, false
	}
	return cr, true
}

// data is e's sealed coldRecord for its pause into layer; nil without a
// Sealer (the pause then lasts as long as the daemon).
func (k *coldKeeper) data(ctx context.Context, e *entry, layer string) ([]byte, error) {
	if k.sealer == nil {
		return nil, nil
	}
	id := e.sb().ID()
	spec := e.spec
	spec.ID, spec.Network, spec.Binds = "", nil, volumeBinds(spec.Binds)
	e.mu.Lock()
	cr := coldRecord{Layer: layer, CreatedLayer: e.createdLayer, BootLayer: e.layer, BaseTemplate: e.baseTemplate, Spec: spec, Timeout: e.timeout,
		AllowInternetAccess: e.info.AllowInternetAccess, TrafficAccessToken: e.info.TrafficAccessToken,
		MaskRequestHost: e.info.MaskRequestHost, AutoPause: e.info.AutoPause, AutoResume: e.info.AutoResume,
		AutoPauseNoMemory: e.info.AutoPauseNoMemory, AutoCheckpoint: e.info.AutoCheckpoint,
		IdleTimeout: e.info.IdleTimeout, IdlePaused: e.idlePaused, IdleLeft: e.idleLeft}
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
	cr.Bindings = k.bindings(id)
	raw, err := json.Marshal(cr)
	if err != nil {
		return nil, err
	}
	return k.sealer.Seal(ctx, coldPurpose(id), raw)
}

// recordPause records e's pause (a move from state from to paused): a
// filesystem-only one into layer, or, with layer "", one with memory. It
// keeps what the resume needs after a restart of the daemon for a
// filesystem-only pause and for a backend sandbox that outlives the daemon
// paused (isolation.Keeper).
func (k *coldKeeper) recordPause(ctx context.Context, e *entry, layer string, from store.State, startedAt, pausedAt time.Time) error {
	if _, keeps := isolation.As[isolation.Keeper](e.sb()); k.cold == nil || (layer == "" && !keeps) {
		return k.store.Transition(ctx, e.sb().ID(), from, store.StatePaused, startedAt, pausedAt)
	}
	data, err := k.data(ctx, e, layer)
	if err != nil {
		// The pause still works; it lasts as long as this daemon.
		k.log.WarnContext(ctx, "sealing what the resume of a paused sandbox needs after a restart; it will not outlive the daemon",
			"sandbox_id", e.sb().ID(), "err", err)
		data = nil
	}
	if err := k.cold.PauseCold(ctx, e.sb().ID(), from, startedAt, pausedAt, data); err != nil {
		return err
	}
	e.mu.Lock()
	e.coldKept = len(data) > 0
	e.mu.Unlock()
	return nil
}

// volumeBinds are the binds of binds that are fence volumes: a resume
// mounts them again (a volume cannot be deleted while a paused sandbox
// mounts it); host binds are never kept.
func volumeBinds(binds []isolation.Bind) []isolation.Bind {
	var out []isolation.Bind
	for _, b := range binds {
		if b.Volume != "" {
			out = append(out, b)
		}
	}
	return out
}
