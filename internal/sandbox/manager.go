package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/capacity"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
	"github.com/fencesandbox/fence/internal/sandbox/idle"
	"github.com/fencesandbox/fence/internal/sandbox/startup"
	"github.com/fencesandbox/fence/internal/sandbox/usage"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
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
	// IdleTimeout is the idle timeout of a sandbox whose create names
	// none (`fence serve --idle-pause`); 0 is none.
	IdleTimeout time.Duration
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
	// Quota holds the teams' limits, checked at each create, pause and
	// resume (quota.go); nil limits nothing.
	Quota tenancy.Admission
	// MaxSandboxes caps sandboxes running or being created; 0 means 1000.
	MaxSandboxes int
	// MaxTimeout is the longest timeout a request may ask for (the
	// daemon's maximum lifetime); 0 means 24h, a negative value no cap.
	MaxTimeout time.Duration
	// KilledRetention is how long killed records stay in the store before
	// Start prunes them; 0 means 24h.
	KilledRetention time.Duration
	// Audit, if set, receives the lifecycle events (create, kill and why).
	Audit audit.Sink
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
	// the collection of layers (internal/sandbox/timetravel), which New
	// binds to the Manager (one Manager per Keeper); without it no create
	// names a snapshot and no filesystem-only pause is made.
	Keeper LayerKeeper
	// Network is the sandboxes' network side (their fences, gateway
	// configurations and policy updates), which New binds to the
	// Manager (one Manager per Set); nil means one with fences.Options'
	// defaults (deny-all egress, no gateway).
	Network *fences.Set
	// Capacity, if set, admits each create (forks and restores included)
	// against the host's limits before anything starts, counting the
	// creates in flight; sandboxes started ahead of demand (warm pools,
	// standbys) leave capacity.PoolReserve creates' worth of headroom.
	Capacity *capacity.Gate
	// Agent reaches a sandbox's agent to run its template's start and
	// ready commands (the daemon's envd client); nil fails the creates of
	// templates that have one.
	Agent startup.Connect
	// Idle, if set, tracks the sandboxes' use and pauses the idle ones
	// (package idle); New binds it to the Manager (one Manager per
	// Tracker) and Start runs it. nil means one with idle.Options'
	// defaults.
	Idle *idle.Tracker
	// Logger; nil discards logs.
	Logger *slog.Logger
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// ErrClosed is returned by calls made after Shutdown. It wraps
// api.ErrUnavailable.
var ErrClosed = fmt.Errorf("sandbox manager is shut down: %w", api.ErrUnavailable)

var errNotStarted = fmt.Errorf("sandbox manager is not started: %w", api.ErrUnavailable)

// Manager owns the lifecycle of sandboxes: the registry of live ones
// (running or paused), their state machine and their store record. Its
// surface is listed in the package doc ("Surface"); pause and resume are
// its Pauses' (pause.go).
type Manager struct {
	backend   isolation.Backend
	store     Store
	templates Templates
	defaults  Defaults

	events     // lifecycle events to the audit trail (audit.go)
	layers     isolation.Layers
	keeper     LayerKeeper // snapshots, checkpoints, layer collection (timetravel)
	sealer     Sealer
	caEnv      map[string]string
	max        int
	adm        *admission        // counts and admits sandboxes (admission.go)
	quota      tenancy.Admission // the teams' quotas (quota.go)
	maxTimeout time.Duration
	retention  time.Duration
	log        *slog.Logger
	now        func() time.Time

	fences *fences.Set // the sandboxes' network side (network.go)

	reaper *reaper       // kills sandboxes at their deadline (reaper.go)
	idle   *idle.Tracker // pauses idle sandboxes (idle.go)
	stop   chan struct{} // closed by Shutdown

	sampleEvery time.Duration
	wg          sync.WaitGroup

	mu sync.Mutex
	// +checklocks:mu
	started bool
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	running map[string]*entry
	// idleable holds the entries of running whose sandbox has an idle
	// timeout (fixed at its create), which the idle tracker looks at
	// every second (idleCore.Candidates) instead of every live one.
	// +checklocks:mu
	idleable map[string]*entry
	// +checklocks:mu

	usage *usage.Meter // usage accounting (usage.go)

	runImages *startup.Images  // templates' run images (runimage.go)
	starts    *startup.Starter // templates' start and ready commands
	cold      *coldKeeper      // pauses' records and resume data (cold.go)
	pauses    *Pauses          // pause and resume (pause.go)
	adopter   *adopter         // takes over a previous daemon's paused sandboxes (adopt.go)
}

// New returns a Manager. Call Start before using it.
func New(opts Options) (*Manager, error) {
	if opts.Backend == nil || opts.Store == nil || opts.Templates == nil {
		return nil, errors.New("sandbox.New: Backend, Store and Templates are required")
	}
	m := &Manager{
		backend:     opts.Backend,
		store:       opts.Store,
		templates:   opts.Templates,
		defaults:    opts.Defaults.withBuiltins(),
		events:      events{opts.Audit},
		layers:      opts.Layers,
		keeper:      opts.Keeper,
		sealer:      opts.Sealer,
		caEnv:       opts.CAEnv,
		max:         opts.MaxSandboxes,
		maxTimeout:  opts.MaxTimeout,
		retention:   opts.KilledRetention,
		log:         opts.Logger,
		now:         opts.Now,
		reaper:      newReaper(),
		idle:        opts.Idle,
		fences:      opts.Network,
		stop:        make(chan struct{}),
		sampleEvery: cmp.Or(opts.SampleEvery, 5*time.Second),
		running:     map[string]*entry{},
		idleable:    map[string]*entry{},
	}
	m.usage = usage.NewMeter(opts.Audit, liveUsage{m}, opts.Now)
	if m.fences == nil {
		m.fences = fences.New(fences.Options{Logger: opts.Logger})
	}
	m.fences.Bind(netCore{m})
	if m.max <= 0 {
		m.max = 1000
	}
	m.adm = newAdmission(m.max, opts.Capacity, opts.Backend)
	if m.quota = opts.Quota; m.quota == nil {
		m.quota = noQuota()
	}
	if m.layers == nil {
		m.layers, _ = opts.Backend.(isolation.Layers)
	}
	if m.keeper == nil {
		m.keeper = noKeeper{}
	}
	switch {
	case m.maxTimeout == 0:
		m.maxTimeout = 24 * time.Hour
	case m.maxTimeout < 0:
		m.maxTimeout = noMaxTimeout
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
	if err := checkIdleTimeout(m.defaults.IdleTimeout); err != nil {
		return nil, fmt.Errorf("sandbox.New: default idle timeout: %w", err)
	}
	if m.defaults.Timeout > m.maxTimeout {
		return nil, fmt.Errorf("sandbox.New: default timeout %v exceeds MaxTimeout %v", m.defaults.Timeout, m.maxTimeout)
	}
	m.runImages = startup.NewImages(imageLayers(m), m.log)
	m.starts = startup.NewStarter(opts.Agent, m.log)
	m.cold = newColdKeeper(m.store, m.sealer, m.log, m.fences.Bindings)
	m.adopter = newAdopter(m)
	m.pauses = newPauses(m)
	if m.idle == nil {
		m.idle = idle.New(idle.Options{Logger: m.log, Now: m.now})
	}
	m.idle.Bind(idleCore{m})
	m.pauses.idle = m.idle
	// Bound last, to the Manager as made: the keeper reads its layers.
	m.keeper.Bind(&LayerPort{m})
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
		if m.adopter.adopt(ctx, s) || m.adopter.adoptCold(ctx, s) {
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
	m.adm.start()
	m.wg.Go(func() { m.reaper.run(m.stop, m.now, m) })
	m.wg.Go(func() { m.usage.Sample(m.stop, m.sampleEvery) })
	m.wg.Go(func() { m.idle.Run(m.stop) })
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

// killBox kills a backend sandbox, even if ctx is already canceled, and
// logs a failure to log.
func killBox(ctx context.Context, log *slog.Logger, box isolation.Sandbox) {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := box.Kill(kctx); err != nil {
		log.ErrorContext(ctx, "killing sandbox", "sandbox_id", box.ID(), "err", err)
	}
}

// killRemoved kills a sandbox just removed from running; its unit of
// admission is held (dying) until the backend has released it.
func (m *Manager) killRemoved(ctx context.Context, box isolation.Sandbox) {
	defer m.adm.released()
	killBox(ctx, m.log, box)
}

// markKilled records sandbox id killed in st, even if ctx is already
// canceled, and logs a failure to log.
func markKilled(ctx context.Context, st Store, log *slog.Logger, id string) {
	if err := st.SetState(context.WithoutCancel(ctx), id, store.StateKilled); err != nil {
		log.ErrorContext(ctx, "marking sandbox killed", "sandbox_id", id, "err", err)
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
		delete(m.idleable, e.sb().ID())
		m.fences.Drop(e.sb().ID())
		m.adm.remove()
		m.quota.Remove(e.sb().ID())
	}
	m.mu.Unlock()
	if ok && cur == e {
		ctx := context.Background()
		m.log.WarnContext(ctx, "sandbox stopped unexpectedly", "sandbox_id", e.sb().ID())
		m.record(ctx, audit.TypeKill, e.sb().ID(), map[string]any{"reason": "exited"})
		e.finishUsage(ctx, m.usage, m.now())
		m.killRemoved(ctx, e.sb()) // release host resources the backend may still hold
		m.keeper.Release(e.sb().ID())
		markKilled(ctx, m.store, m.log, e.sb().ID())
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
	m.adm.close()
	all := make([]*entry, 0, len(m.running))
	for id, e := range m.running {
		all = append(all, e)
		delete(m.running, id)
		delete(m.idleable, id)
		m.fences.Drop(id)
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
				e.finishUsage(ctx, m.usage, m.now())
				killBox(ctx, m.log, e.sb())
				markKilled(ctx, m.store, m.log, e.sb().ID())
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
