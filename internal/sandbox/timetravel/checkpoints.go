package timetravel

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox"
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
func (k *Keeper) CreateCheckpoint(ctx context.Context, id, name string, auto bool) (*Checkpoint, error) {
	ls, err := k.layerStore()
	if err != nil {
		return nil, err
	}
	if len(name) > maxSnapshotNameBytes {
		return nil, invalid("checkpoint name longer than %d bytes", maxSnapshotNameBytes)
	}
	l, err := k.running(id, fmt.Errorf("sandbox %s is paused: resume it first: %w", id, api.ErrConflict))
	if err != nil {
		return nil, err
	}
	l.Lock()
	defer l.Unlock()
	if !l.Running() {
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
		k.Collect()
	}
	k.lock.RLock()
	defer k.lock.RUnlock()
	info, err := k.checkpointBox(ctx, l.Box())
	if err != nil {
		return nil, fmt.Errorf("checkpointing sandbox %s: %w", id, err)
	}
	c := &store.Checkpoint{ID: "cp" + strings.ToLower(isolation.NewID()), SandboxID: id, Layer: info.ID, Name: name, Auto: auto,
		Files: info.Files, Bytes: info.Bytes, CreatedAt: k.now().UTC()}
	if err := ls.InsertCheckpoint(context.WithoutCancel(ctx), c); err != nil {
		_ = k.layers.DeleteLayer(context.WithoutCancel(ctx), info.ID)
		return nil, err
	}
	l.MarkCheckpointed()
	k.prepareStandby(l, info.ID)
	k.record(ctx, audit.TypeSandboxCheckpoint, id, map[string]any{"checkpoint": c.ID, "files": c.Files, "bytes": c.Bytes, "auto": auto})
	out := toCheckpoint(c)
	out.Frozen = info.Took
	return out, nil
}

func toCheckpoint(c *store.Checkpoint) *Checkpoint {
	return &Checkpoint{ID: c.ID, SandboxID: c.SandboxID, Name: c.Name, Auto: c.Auto, Files: c.Files, Bytes: c.Bytes, CreatedAt: c.CreatedAt}
}

// Checkpoints lists a live sandbox's checkpoints, oldest first.
func (k *Keeper) Checkpoints(ctx context.Context, id string) ([]*Checkpoint, error) {
	ls, err := k.layerStore()
	if err != nil {
		return nil, err
	}
	if _, err := k.core.Live(id); err != nil {
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
func (k *Keeper) AutoCheckpoint(ctx context.Context, id string) {
	l, err := k.core.Live(id)
	if err != nil || !l.AutoCheckpoint() {
		return
	}
	if _, err := k.CreateCheckpoint(ctx, id, "", true); err != nil {
		k.log.WarnContext(ctx, "automatic checkpoint failed", "sandbox_id", id, "err", err)
	}
}

func (k *Keeper) findCheckpoint(ctx context.Context, ls LayerStore, id, ref string) (*store.Checkpoint, error) {
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
func (k *Keeper) Rewind(ctx context.Context, id, ref string) (*sandbox.Sandbox, error) {
	ls, err := k.layerStore()
	if err != nil {
		return nil, err
	}
	l, err := k.running(id, fmt.Errorf("sandbox %s is paused: resume it first: %w", id, api.ErrConflict))
	if err != nil {
		return nil, err
	}
	c, err := k.findCheckpoint(ctx, ls, id, ref)
	if err != nil {
		return nil, err
	}
	l.Lock()
	defer l.Unlock()
	if !l.Running() {
		return nil, fmt.Errorf("sandbox %s is paused: resume it first: %w", id, api.ErrConflict)
	}
	ctx = context.WithoutCancel(ctx)
	k.lock.RLock()
	defer k.lock.RUnlock()
	t0 := k.now()
	handed, err := l.Reboot(ctx, c.Layer, func(ctx context.Context) (isolation.Sandbox, string) {
		return k.takeStandby(ctx, id, c.Layer)
	})
	if err != nil {
		return nil, err
	}
	took := k.now().Sub(t0)
	// The next rewind to it is likely: one more standby on it.
	k.prepareStandby(l, c.Layer)
	k.Collect()
	k.record(ctx, audit.TypeRewind, id, map[string]any{"checkpoint": c.ID})
	k.log.InfoContext(ctx, "sandbox rewound", "sandbox_id", id, "checkpoint", c.ID, "standby", handed, "took", took)
	return l.Info(), nil
}
