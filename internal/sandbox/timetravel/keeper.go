// Package timetravel keeps fence's time travel over live sandboxes:
// snapshots (snapshots.go), forks, checkpoints and rewinds
// (checkpoints.go), diffs (diff.go), the standbys that make a rewind to
// the last checkpoint a hand-over instead of a boot (standby.go), and the
// filesystem layers they all rest on (isolation.Layers,
// isolation.Checkpointer): the layer lock (lock.go) and the collector of
// the layers nothing keeps.
//
// A Keeper owns that state: the snapshot and checkpoint records (through
// its LayerStore), the standbys, the pins of diffs, the lock. It reaches
// the lifecycle core (package sandbox) only through Core, which
// *sandbox.LayerPort implements, and the core reaches it through
// sandbox.LayerKeeper, which *Keeper implements: the core never sees a
// standby or a record, the keeper never a sandbox's fields.
//
// Ownership of layers: the store's snapshot and checkpoint records, every
// live sandbox (the layer it booted on, or the layer of its
// filesystem-only pause), every standby, the templates' run images and
// every pin of a diff keep a layer and, through it, its parents. The
// collector deletes every other layer; it runs after the records or
// sandboxes that kept a layer go, and at Start (when every checkpoint of a
// previous daemon's sandboxes is dropped), so a crash at any point leaves
// layers that the next start keeps (recorded) or deletes.
//
// A Keeper is made before the Manager, which it is given to
// (sandbox.Options.Keeper) and which binds it to itself in sandbox.New.
// Every method is safe for concurrent use once that New has returned.
package timetravel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// LayerStore is the persistence of snapshots and checkpoints;
// *store.Store implements it.
type LayerStore interface {
	PutSnapshot(ctx context.Context, sn *store.Snapshot) (string, error)
	FindSnapshot(ctx context.Context, ref string) (*store.Snapshot, error)
	ListSnapshots(ctx context.Context, sandboxID, name string) ([]*store.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
	InsertCheckpoint(ctx context.Context, c *store.Checkpoint) error
	Checkpoints(ctx context.Context, sandboxID string) ([]*store.Checkpoint, error)
	DeleteCheckpoints(ctx context.Context, sandboxID, id string) error
	DeleteOrphanCheckpoints(ctx context.Context) error
}

var _ LayerStore = (*store.Store)(nil)

// Core is what the Keeper needs of the lifecycle core; *sandbox.LayerPort
// implements it.
type Core interface {
	// Backend is the backend's name, for errors.
	Backend() string
	// Layers are the layers sandboxes boot on; nil when the backend keeps
	// none (every operation then fails with sandbox.NoLayers).
	Layers() isolation.Layers
	// MaxSandboxes is the cap on sandboxes running or being created.
	MaxSandboxes() int
	// CheckTimeout checks a requested timeout as a create does.
	CheckTimeout(d time.Duration) error
	// Live returns a live sandbox, or an error wrapping api.ErrNotFound.
	Live(id string) (*sandbox.Live, error)
	// Create starts a sandbox on a layer.
	Create(ctx context.Context, req sandbox.CreateRequest, from *sandbox.Origin) (*sandbox.Sandbox, error)
	// AdmitAhead reports whether a standby may start (host headroom).
	AdmitAhead() bool
	// KeptLayers lists the layers the lifecycle keeps.
	KeptLayers() []string
}

var (
	_ Core                = (*sandbox.LayerPort)(nil)
	_ sandbox.LayerKeeper = (*Keeper)(nil)
)

// Budgets.
const (
	maxForks             = 100
	maxCheckpoints       = 64 // per sandbox; the oldest automatic ones go first
	forkParallel         = 4
	maxSnapshotNameBytes = 128
)

// Options configure a Keeper.
type Options struct {
	// Store keeps the snapshot and checkpoint records; nil means none
	// (every operation fails with sandbox.NoLayers).
	Store LayerStore
	// Templates are the sandbox manager's: a snapshot name may not be a
	// template's, and a create's template is a snapshot only when no
	// template has its name.
	Templates sandbox.Templates
	// Sealer, if set, seals the environment a snapshot keeps (without
	// one a sandbox made from a snapshot has its create's alone).
	Sealer sandbox.Sealer
	// Audit, if set, receives the snapshot, fork, checkpoint and rewind
	// events.
	Audit audit.Sink
	// NoStandbys turns off the sandboxes booted ahead on a sandbox's
	// last checkpoint, which make a rewind to it a hand-over instead of a
	// boot (standby.go), at the cost of one idle sandbox per checkpointed
	// one.
	NoStandbys bool
	// Quota, if set, admits each team's snapshots against its limits
	// (with a Store that is a SnapshotCounter).
	Quota SnapshotQuota
	// Logger; nil discards logs.
	Logger *slog.Logger
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// Keeper owns snapshots, forks, checkpoints, rewinds, diffs, standbys and
// the collection of layers. Make it with New, give it to the sandbox
// manager (its sandbox.Options.Keeper, which sandbox.New binds), Start it
// once the manager has started, and Close it once the manager is shut
// down.
type Keeper struct {
	core      Core             // set once by Bind
	layers    isolation.Layers // the core's, set by Bind
	store     LayerStore
	templates sandbox.Templates
	sealer    sandbox.Sealer
	audit     audit.Sink
	quota     SnapshotQuota // nil: snapshots are not limited
	log       *slog.Logger
	now       func() time.Time

	lock   layerLock     // see layerLock and gc
	gcWake chan struct{} // nudges the layer collector; buffered 1
	stop   chan struct{} // closed by Close
	wg     sync.WaitGroup

	noStandbys  bool
	standbyBoot chan struct{} // one standby boots at a time

	mu sync.Mutex
	// +checklocks:mu
	standbys map[string]*standby // by sandbox ID (standby.go)
	// +checklocks:mu
	closed bool
}

// New returns a Keeper, to be given to sandbox.New (Options.Keeper)
// before it is used.
func New(opts Options) *Keeper {
	k := &Keeper{
		store:       opts.Store,
		templates:   opts.Templates,
		sealer:      opts.Sealer,
		audit:       opts.Audit,
		quota:       opts.Quota,
		log:         opts.Logger,
		now:         opts.Now,
		gcWake:      make(chan struct{}, 1),
		stop:        make(chan struct{}),
		noStandbys:  opts.NoStandbys,
		standbyBoot: make(chan struct{}, 1),
		standbys:    map[string]*standby{},
	}
	k.lock.wake = k.Collect
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	if k.now == nil {
		k.now = time.Now
	}
	return k
}

// Bind gives the Keeper the lifecycle core it serves: the LayerPort of
// the manager whose Options.Keeper it is. It is called once, by
// sandbox.New, before the manager is returned; a second call (the Keeper
// given to a second manager) panics.
func (k *Keeper) Bind(p *sandbox.LayerPort) {
	if k.core != nil {
		panic("timetravel: Keeper bound to a second manager")
	}
	k.core = p
	k.layers = p.Layers()
}

// Start deletes the layers that nothing keeps (checkpoints of a previous
// daemon's sandboxes, forks' and pauses' layers, half-recorded ones) and
// starts the collector, which runs until Close. Call it once the manager
// has started (it has taken over what a previous daemon left).
func (k *Keeper) Start(ctx context.Context) error {
	if err := k.gc(ctx); err != nil && !errors.Is(err, errLayersBusy) {
		return fmt.Errorf("collecting unused layers: %w", err)
	}
	if k.layers != nil {
		k.wg.Go(k.collector)
	}
	return nil
}

// Close kills every standby and stops the collector; it returns once
// every goroutine of the Keeper has. Later standbys are not booted.
func (k *Keeper) Close() {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	k.closed = true
	all := make([]*standby, 0, len(k.standbys))
	for id, sb := range k.standbys {
		all = append(all, sb)
		delete(k.standbys, id)
	}
	k.mu.Unlock()
	close(k.stop)
	for _, sb := range all {
		k.dropStandby(sb)
	}
	k.wg.Wait()
}

// layerStore returns the store of records, or sandbox.NoLayers.
func (k *Keeper) layerStore() (LayerStore, error) {
	if k.store == nil || k.layers == nil {
		return nil, sandbox.NoLayers(k.core.Backend())
	}
	return k.store, nil
}

// Hold takes the layer lock for reading until release (see layerLock).
func (k *Keeper) Hold() (release func()) {
	k.lock.RLock()
	return k.lock.RUnlock
}

// running returns a running sandbox: unknown ones give api.ErrNotFound,
// paused ones pausedErr.
func (k *Keeper) running(id string, pausedErr error) (*sandbox.Live, error) {
	l, err := k.core.Live(id)
	if err != nil {
		return nil, err
	}
	if !l.Running() {
		return nil, pausedErr
	}
	return l, nil
}

// checkpointBox freezes box's filesystem into a new layer. The caller
// holds the layer lock for reading until the layer is recorded or used.
func (k *Keeper) checkpointBox(ctx context.Context, box isolation.Sandbox) (isolation.LayerInfo, error) {
	cp, ok := isolation.As[isolation.Checkpointer](box)
	if !ok {
		return isolation.LayerInfo{}, fmt.Errorf("the %s backend cannot checkpoint sandboxes: %w", k.core.Backend(), api.ErrUnimplemented)
	}
	return layerErr(box.ID())(cp.Checkpoint(context.WithoutCancel(ctx)))
}

// CheckpointFiles freezes box's filesystem alone into a new layer, on
// which the sandbox boots anew: a backend whose checkpoints keep memory
// makes it with isolation.FileCheckpointer. The caller holds the layer
// lock for reading.
func (k *Keeper) CheckpointFiles(ctx context.Context, box isolation.Sandbox) (isolation.LayerInfo, error) {
	if _, err := k.layerStore(); err != nil {
		return isolation.LayerInfo{}, err
	}
	fc, ok := isolation.As[isolation.FileCheckpointer](box)
	if !ok {
		info, err := k.checkpointBox(ctx, box)
		if err == nil && info.Memory {
			_ = k.layers.DeleteLayer(context.WithoutCancel(ctx), info.ID)
			return isolation.LayerInfo{}, fmt.Errorf("this backend cannot checkpoint a filesystem without memory: %w", api.ErrUnimplemented)
		}
		return info, err
	}
	return layerErr(box.ID())(fc.CheckpointFiles(context.WithoutCancel(ctx)))
}

// layerErr maps the backend's errors of a checkpoint of sandbox id to
// the API's.
func layerErr(id string) func(isolation.LayerInfo, error) (isolation.LayerInfo, error) {
	return func(info isolation.LayerInfo, err error) (isolation.LayerInfo, error) {
		if errors.Is(err, isolation.ErrLayerBudget) {
			return info, fmt.Errorf("%w: %w", err, api.ErrResourceExhausted)
		}
		if errors.Is(err, isolation.ErrNotFound) {
			return info, notFound(id)
		}
		return info, err
	}
}

// Collect asks the layer collector to run.
func (k *Keeper) Collect() {
	if k.layers == nil {
		return
	}
	select {
	case k.gcWake <- struct{}{}:
	default:
	}
}

// collector runs gc when nudged, until Close.
func (k *Keeper) collector() {
	for {
		select {
		case <-k.stop:
			return
		case <-k.gcWake:
			err := k.gc(context.Background())
			if errors.Is(err, errLayersBusy) {
				continue // the last reader out wakes it
			}
			if errors.Is(err, isolation.ErrLayerInUse) {
				// A killed sandbox still releasing: try again shortly.
				time.AfterFunc(time.Second, k.Collect)
			} else if err != nil {
				k.log.Error("collecting unused layers", "err", err)
			}
		}
	}
}

// errLayersBusy is gc's when the layer lock is held: it runs again when
// the lock is released (see layerLock).
var errLayersBusy = errors.New("layers busy: collecting once they are not")

// gc deletes the layers that no record, no live sandbox, no standby and
// no pin keeps. It never waits for the layer lock (see layerLock).
func (k *Keeper) gc(ctx context.Context) error {
	// Every team's records keep layers: the collector reads them all.
	ctx = tenancy.NewContext(ctx, tenancy.Principal{})
	ls, err := k.layerStore()
	if err != nil {
		return nil
	}
	if !k.lock.TryLock() {
		return errLayersBusy
	}
	defer k.lock.Unlock()
	if err := ls.DeleteOrphanCheckpoints(ctx); err != nil {
		return err
	}
	keep := map[string]bool{}
	sns, err := ls.ListSnapshots(ctx, "", "")
	if err != nil {
		return err
	}
	for _, sn := range sns {
		keep[sn.Layer] = true
	}
	cps, err := ls.Checkpoints(ctx, "")
	if err != nil {
		return err
	}
	for _, c := range cps {
		keep[c.Layer] = true
	}
	for _, l := range k.lock.pinned() {
		keep[l] = true
	}
	for _, l := range k.core.KeptLayers() {
		keep[l] = true
	}
	k.mu.Lock()
	for _, sb := range k.standbys {
		keep[sb.layer] = true
	}
	k.mu.Unlock()
	all, err := k.layers.ListLayers(ctx)
	if err != nil {
		return err
	}
	parent := map[string]string{}
	for _, l := range all {
		parent[l.ID] = l.Parent
	}
	marked := map[string]bool{}
	for id := range keep {
		for ; id != "" && !marked[id]; id = parent[id] {
			marked[id] = true
		}
	}
	var errs []error
	for _, l := range all {
		if !marked[l.ID] {
			errs = append(errs, k.layers.DeleteLayer(ctx, l.ID))
		}
	}
	return errors.Join(errs...)
}

// kill kills a backend sandbox (a standby), even if ctx is already
// canceled.
func (k *Keeper) kill(ctx context.Context, box isolation.Sandbox) {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := box.Kill(kctx); err != nil {
		k.log.ErrorContext(ctx, "killing sandbox", "sandbox_id", box.ID(), "err", err)
	}
}

// record appends an event to the audit trail, if there is one. The actor
// is the one ctx carries (the API key's holder), or "daemon".
func (k *Keeper) record(ctx context.Context, typ, id string, data map[string]any) {
	if k.audit == nil {
		return
	}
	k.audit.Append(context.WithoutCancel(ctx), audit.Event{Type: typ, SandboxID: id, Actor: audit.ActorFrom(ctx), Data: data})
}

func notFound(id string) error {
	return fmt.Errorf("sandbox %q not found: %w", id, api.ErrNotFound)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), api.ErrInvalidArgument)
}
