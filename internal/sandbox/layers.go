package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/store"
)

// What snapshots (snapshots.go), forks, checkpoints and rewinds
// (checkpoints.go), diffs (diff.go) and filesystem-only pauses share: the
// layer store, the boot of a sandbox on a layer, and the layer collector.
// All rest on the backend's layers (isolation.Layers, isolation.Checkpointer).
//
// Ownership of layers: the store's snapshot and checkpoint records, and
// every live sandbox (the layer it booted on, or the layer of its
// filesystem-only pause), keep a layer and, through it, its parents. gc
// deletes every other layer; it runs after the records or sandboxes that
// kept a layer go, and at Start (when no sandbox is live and every
// checkpoint of a previous daemon's sandboxes is dropped), so a crash at
// any point leaves layers that the next start keeps (recorded) or deletes.

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

// Budgets.
const (
	maxForks             = 100
	maxCheckpoints       = 64 // per sandbox; the oldest automatic ones go first
	forkParallel         = 4
	defaultForkTimeout   = 15 * time.Second
	maxSnapshotNameBytes = 128
)

func (m *Manager) layerStore() (LayerStore, error) {
	ls, ok := m.store.(LayerStore)
	if !ok || m.layers == nil {
		return nil, fmt.Errorf("snapshots, forks, checkpoints and filesystem-only pauses need filesystem layers, which the %s backend does not keep: %w", m.backend.Name(), api.ErrUnimplemented)
	}
	return ls, nil
}

// bootOn starts a backend sandbox for spec on layer, with the compiled
// network nc (a sandbox already under its ID, a reboot's, keeps the
// fence it has, and its policy).
func (m *Manager) bootOn(ctx context.Context, spec isolation.Spec, nc *netconf.Config, layer string) (isolation.Sandbox, error) {
	spec.Network = m.fences.Network(nc.Policy, nc.Proxy)
	return m.layers.CreateOn(ctx, spec, layer)
}

// checkpointBox freezes e's filesystem into a new layer. The caller holds
// m.layerMu for reading until the layer is recorded or used.
func (m *Manager) checkpointBox(ctx context.Context, e *entry) (isolation.LayerInfo, error) {
	cp, ok := isolation.As[isolation.Checkpointer](e.sb())
	if !ok {
		return isolation.LayerInfo{}, fmt.Errorf("the %s backend cannot checkpoint sandboxes: %w", m.backend.Name(), api.ErrUnimplemented)
	}
	info, err := cp.Checkpoint(context.WithoutCancel(ctx))
	if errors.Is(err, isolation.ErrLayerBudget) {
		return info, fmt.Errorf("%w: %w", err, api.ErrResourceExhausted)
	}
	if errors.Is(err, isolation.ErrNotFound) {
		return info, notFound(e.sb().ID())
	}
	return info, err
}

// checkpointFiles freezes e's filesystem alone into a new layer, on which
// the sandbox boots anew: a backend whose checkpoints keep memory makes it
// with isolation.FileCheckpointer. The caller holds m.layerMu for reading.
func (m *Manager) checkpointFiles(ctx context.Context, e *entry) (isolation.LayerInfo, error) {
	fc, ok := isolation.As[isolation.FileCheckpointer](e.sb())
	if !ok {
		info, err := m.checkpointBox(ctx, e)
		if err == nil && info.Memory {
			_ = m.layers.DeleteLayer(context.WithoutCancel(ctx), info.ID)
			return isolation.LayerInfo{}, fmt.Errorf("this backend cannot checkpoint a filesystem without memory: %w", api.ErrUnimplemented)
		}
		return info, err
	}
	info, err := fc.CheckpointFiles(context.WithoutCancel(ctx))
	if errors.Is(err, isolation.ErrLayerBudget) {
		return info, fmt.Errorf("%w: %w", err, api.ErrResourceExhausted)
	}
	if errors.Is(err, isolation.ErrNotFound) {
		return info, notFound(e.sb().ID())
	}
	return info, err
}

// running returns the entry of a running sandbox: unknown ones give
// api.ErrNotFound, paused ones pausedErr.
func (m *Manager) runningEntry(id string, pausedErr error) (*entry, error) {
	e, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	if e.state() != StateRunning {
		return nil, pausedErr
	}
	return e, nil
}

// stillLive kills box, just set as e's, if e was killed meanwhile (Kill
// does not wait for a reboot): whichever comes second kills it.
func (m *Manager) stillLive(ctx context.Context, e *entry, box isolation.Sandbox) error {
	m.mu.Lock()
	cur := m.running[box.ID()]
	m.mu.Unlock()
	if cur != e {
		m.killBox(ctx, box)
		return notFound(box.ID())
	}
	return nil
}

// pauseCold is the filesystem-only pause: the filesystem is checkpointed,
// every process is killed (the memory is freed), and the resume boots the
// sandbox anew on the checkpoint.
func (m *Manager) pauseCold(ctx context.Context, id, reason string) error {
	if _, err := m.layerStore(); err != nil {
		return err
	}
	e, err := m.lookup(id)
	if err != nil {
		return err
	}
	e.life.Lock()
	defer e.life.Unlock()
	started, reopen, err := m.stopRun(e, id)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	m.layerMu.RLock()
	defer m.layerMu.RUnlock()
	info, err := m.checkpointFiles(ctx, e)
	if err != nil {
		reopen()
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	clock := m.now()
	now := clock.UTC()
	if err := m.cold.recordPause(ctx, e, info.ID, store.StateRunning, started, now); err != nil {
		_ = m.layers.DeleteLayer(ctx, info.ID)
		reopen()
		return fmt.Errorf("recording the pause of sandbox %s: %w", id, err)
	}
	old := e.sb()
	e.setBox(parkedBox{id})
	e.mu.Lock()
	e.cold = info.ID
	e.info.EndAt = now
	e.use.Mark(clock, true)
	e.mu.Unlock()
	m.killBox(ctx, old)
	m.record(ctx, audit.TypePause, id, map[string]any{"reason": reason, "memory": false})
	m.log.InfoContext(ctx, "sandbox paused without memory", "sandbox_id", id, "reason", reason)
	return nil
}

// resumeCold boots a sandbox paused without memory on its pause's layer.
// The caller holds e.life and has recorded the resume.
func (m *Manager) resumeCold(ctx context.Context, e *entry) error {
	e.mu.Lock()
	layer := e.cold
	e.mu.Unlock()
	m.layerMu.RLock()
	defer m.layerMu.RUnlock()
	spec := e.spec
	spec.ID = e.sb().ID()
	e.mu.Lock()
	nc := e.net
	e.mu.Unlock()
	box, err := m.bootOn(ctx, spec, nc, layer)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.cold, e.layer, e.coldKept = "", layer, false
	e.mu.Unlock()
	e.setBox(box)
	m.nudgeGC()
	return m.stillLive(ctx, e, box)
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

// nudgeGC asks the layer collector to run.
func (m *Manager) nudgeGC() {
	if m.layers == nil {
		return
	}
	select {
	case m.gcWake <- struct{}{}:
	default:
	}
}

// layerCollector runs gc when nudged, until Shutdown.
func (m *Manager) layerCollector() {
	for {
		select {
		case <-m.stop:
			return
		case <-m.gcWake:
			err := m.gc(context.Background())
			if errors.Is(err, errLayersBusy) {
				continue // the last reader out wakes it
			}
			if errors.Is(err, isolation.ErrLayerInUse) {
				// A killed sandbox still releasing: try again shortly.
				time.AfterFunc(time.Second, m.nudgeGC)
			} else if err != nil {
				m.log.Error("collecting unused layers", "err", err)
			}
		}
	}
}

// errLayersBusy is gc's when the layer lock is held: it runs again when
// the lock is released (see layerLock).
var errLayersBusy = errors.New("layers busy: collecting once they are not")

// gc deletes the layers that no record, no live sandbox and no pin keeps.
// It never waits for the layer lock (see layerLock).
func (m *Manager) gc(ctx context.Context) error {
	ls, ok := m.store.(LayerStore)
	if !ok || m.layers == nil {
		return nil
	}
	if !m.layerMu.TryLock() {
		return errLayersBusy
	}
	defer m.layerMu.Unlock()
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
	for _, l := range m.runImages.Layers() {
		keep[l] = true
	}
	for _, l := range m.layerMu.pinned() {
		keep[l] = true
	}
	m.mu.Lock()
	for _, e := range m.running {
		e.mu.Lock()
		keep[e.layer], keep[e.cold] = true, true
		if e.standby != nil {
			keep[e.standby.layer] = true
		}
		e.mu.Unlock()
	}
	m.mu.Unlock()
	all, err := m.layers.ListLayers(ctx)
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
			errs = append(errs, m.layers.DeleteLayer(ctx, l.ID))
		}
	}
	return errors.Join(errs...)
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
