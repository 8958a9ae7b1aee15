package sandbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/store"
)

// Checkpoint is one checkpoint of a sandbox.
type Checkpoint struct {
	ID        string
	SandboxID string
	Name      string
	Auto      bool
	Files     int
	Bytes     int64
	CreatedAt time.Time
	// Frozen is how long the sandbox was stopped while it was taken.
	Frozen time.Duration
}

// CreateCheckpoint checkpoints a running sandbox's filesystem (fence's
// extension). A paused sandbox gives api.ErrConflict.
func (m *Manager) CreateCheckpoint(ctx context.Context, id, name string, auto bool) (*Checkpoint, error) {
	ls, err := m.layerStore()
	if err != nil {
		return nil, err
	}
	if len(name) > maxSnapshotNameBytes {
		return nil, invalid("checkpoint name longer than %d bytes", maxSnapshotNameBytes)
	}
	e, err := m.runningEntry(id, fmt.Errorf("sandbox %s is paused: resume it first: %w", id, api.ErrConflict))
	if err != nil {
		return nil, err
	}
	e.life.Lock()
	defer e.life.Unlock()
	if e.state() != StateRunning {
		return nil, fmt.Errorf("sandbox %s is paused: resume it first: %w", id, api.ErrConflict)
	}
	old, err := ls.Checkpoints(ctx, id)
	if err != nil {
		return nil, err
	}
	if len(old) >= maxCheckpoints {
		var drop *store.Checkpoint
		for _, c := range old {
			if c.Auto {
				drop = c
				break
			}
		}
		if drop == nil {
			return nil, fmt.Errorf("sandbox %s has %d checkpoints, the most it may keep: delete one: %w", id, len(old), api.ErrResourceExhausted)
		}
		if err := ls.DeleteCheckpoints(ctx, id, drop.ID); err != nil {
			return nil, err
		}
		m.nudgeGC()
	}
	m.layerMu.RLock()
	defer m.layerMu.RUnlock()
	info, err := m.checkpointBox(ctx, e)
	if err != nil {
		return nil, fmt.Errorf("checkpointing sandbox %s: %w", id, err)
	}
	c := &store.Checkpoint{ID: "cp" + strings.ToLower(isolation.NewID()), SandboxID: id, Layer: info.ID, Name: name, Auto: auto,
		Files: info.Files, Bytes: info.Bytes, CreatedAt: m.now().UTC()}
	if err := ls.InsertCheckpoint(context.WithoutCancel(ctx), c); err != nil {
		_ = m.layers.DeleteLayer(context.WithoutCancel(ctx), info.ID)
		return nil, err
	}
	e.checkpointed.Store(true)
	m.prepareStandby(e, info.ID)
	m.record(ctx, audit.TypeSandboxCheckpoint, id, map[string]any{"checkpoint": c.ID, "files": c.Files, "bytes": c.Bytes, "auto": auto})
	out := toCheckpoint(c)
	out.Frozen = info.Took
	return out, nil
}

func toCheckpoint(c *store.Checkpoint) *Checkpoint {
	return &Checkpoint{ID: c.ID, SandboxID: c.SandboxID, Name: c.Name, Auto: c.Auto, Files: c.Files, Bytes: c.Bytes, CreatedAt: c.CreatedAt}
}

// Checkpoints lists a live sandbox's checkpoints, oldest first.
func (m *Manager) Checkpoints(ctx context.Context, id string) ([]*Checkpoint, error) {
	ls, err := m.layerStore()
	if err != nil {
		return nil, err
	}
	if _, err := m.lookup(id); err != nil {
		return nil, err
	}
	cs, err := ls.Checkpoints(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]*Checkpoint, 0, len(cs))
	for _, c := range cs {
		out = append(out, toCheckpoint(c))
	}
	return out, nil
}

// AutoCheckpoint checkpoints a sandbox created with AutoCheckpoint before
// a command runs in it; it does nothing for others. A failure is logged:
// the command still runs.
func (m *Manager) AutoCheckpoint(ctx context.Context, id string) {
	e, err := m.lookup(id)
	if err != nil || !e.autoCheckpoint {
		return
	}
	if _, err := m.CreateCheckpoint(ctx, id, "", true); err != nil {
		m.log.WarnContext(ctx, "automatic checkpoint failed", "sandbox_id", id, "err", err)
	}
}

func (m *Manager) findCheckpoint(ctx context.Context, ls LayerStore, id, ref string) (*store.Checkpoint, error) {
	cs, err := ls.Checkpoints(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		if c.ID == ref || (c.Name != "" && c.Name == ref) {
			return c, nil
		}
	}
	return nil, fmt.Errorf("checkpoint %q of sandbox %s not found: %w", ref, id, api.ErrNotFound)
}

// Rewind reboots a running sandbox on one of its checkpoints: its
// filesystem is the checkpoint's again and its processes start anew
// (memory is not kept), or, on a backend whose checkpoints keep memory
// (LayerInfo.Memory: gvisor), its processes are back as they were at the
// checkpoint. Its ID, token, deadline, metadata, environment,
// network and secret bindings stay.
func (m *Manager) Rewind(ctx context.Context, id, ref string) (*Sandbox, error) {
	ls, err := m.layerStore()
	if err != nil {
		return nil, err
	}
	e, err := m.runningEntry(id, fmt.Errorf("sandbox %s is paused: resume it first: %w", id, api.ErrConflict))
	if err != nil {
		return nil, err
	}
	c, err := m.findCheckpoint(ctx, ls, id, ref)
	if err != nil {
		return nil, err
	}
	e.life.Lock()
	defer e.life.Unlock()
	if e.state() != StateRunning {
		return nil, fmt.Errorf("sandbox %s is paused: resume it first: %w", id, api.ErrConflict)
	}
	ctx = context.WithoutCancel(ctx)
	m.layerMu.RLock()
	defer m.layerMu.RUnlock()
	t0 := m.now()
	handed, err := m.reboot(ctx, e, c.Layer)
	if err != nil {
		return nil, err
	}
	took := m.now().Sub(t0)
	// The next rewind to it is likely: one more standby on it.
	m.prepareStandby(e, c.Layer)
	m.nudgeGC()
	m.record(ctx, audit.TypeRewind, id, map[string]any{"checkpoint": c.ID})
	m.log.InfoContext(ctx, "sandbox rewound", "sandbox_id", id, "checkpoint", c.ID, "standby", handed, "took", took)
	return e.snapshot(), nil
}

// reboot replaces e's backend sandbox by a new one, under the same ID, on
// layer: its standby on layer if it has one (reporting true), else one
// booted now. Traffic meanwhile finds it paused (the proxy's 502). If the
// new one cannot start, the sandbox is killed.
func (m *Manager) reboot(ctx context.Context, e *entry, layer string) (bool, error) {
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
		m.killBox(ctx, old)
	}
	spec := e.spec
	spec.ID = id
	var err error
	box, key := m.takeStandby(ctx, e, layer)
	handed := box != nil
	if box != nil {
		if err = m.handOver(box, key, nc); err != nil {
			m.log.WarnContext(ctx, "handing a standby over; booting anew", "sandbox_id", id, "err", err)
			m.killBox(ctx, box)
			box, handed = nil, false
		}
	}
	if box == nil {
		box, err = m.bootOn(ctx, spec, nc, layer)
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
	return handed, m.stillLive(ctx, e, box)
}
