package timetravel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/store"
)

// SnapshotInfo is E2B's SnapshotInfo.
type SnapshotInfo struct {
	SnapshotID string
	Names      []string
	SandboxID  string
	CreatedAt  time.Time
}

// ForkResult is one fork: a sandbox or the error that prevented it.
type ForkResult struct {
	Sandbox *sandbox.Sandbox
	Err     error
}

// Origin resolves a create's template to a snapshot, or nil for a
// template (ordinary templates first).
func (k *Keeper) Origin(ctx context.Context, ref string) (*sandbox.Origin, error) {
	ls, err := k.layerStore()
	if err != nil || ref == "" {
		return nil, nil
	}
	if k.HasTemplate(ref) {
		return nil, nil
	}
	sn, err := ls.FindSnapshot(ctx, ref)
	if err != nil {
		if errors.Is(err, api.ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	if f, ok := ls.(Fetcher); ok {
		if err := f.Fetch(ctx, sn); err != nil {
			return nil, err
		}
	}
	var spec snapshotSpec
	_ = json.Unmarshal([]byte(sn.Spec), &spec) // older records lack fields
	var env map[string]string
	if len(spec.Env) > 0 && k.sealer != nil {
		raw, err := k.sealer.Unseal(ctx, snapshotEnvPurpose(sn.Layer), spec.Env)
		if err == nil {
			err = json.Unmarshal(raw, &env)
		}
		if err != nil { // a lost key: the create's environment alone
			k.log.WarnContext(ctx, "opening the environment of a snapshot", "snapshot", sn.ID, "err", err)
			env = nil
		}
	}
	return &sandbox.Origin{Layer: sn.Layer, Template: sn.Template, Shown: sn.ID, Alias: sn.Name, Backend: spec.Backend, Env: env,
		Memory: spec.Memory}, nil
}

// Fetcher is implemented by a LayerStore whose snapshots' layers may be
// on another node (internal/snapreg): Fetch brings them to this one
// before a sandbox is made from the snapshot.
type Fetcher interface {
	Fetch(ctx context.Context, sn *store.Snapshot) error
}

// snapshotSpec is a snapshot record's Spec: what its source was made with.
type snapshotSpec struct {
	CPUs     float64 `json:"cpus"`
	MemoryMB int64   `json:"memoryMB"`
	DiskMB   int64   `json:"diskMB"`
	Template string  `json:"template"`
	// Backend is the source's metadata fence.backend: a sandbox made from
	// the snapshot shows it too (it runs where the snapshot's layer is).
	Backend string `json:"backend,omitempty"`
	// Env is the source's agent environment (fence's own variables, the
	// template's and its create's), sealed (Options.Sealer; not kept
	// without one): a sandbox made from the snapshot has it under its own
	// create's, as E2B's restored envd keeps it.
	Env []byte `json:"envSealed,omitempty"`
	// Memory is the layer's LayerInfo.Memory: a sandbox made from it goes
	// on with the source's processes (its start command runs already).
	Memory bool `json:"memory,omitempty"`
}

// snapshotEnvPurpose binds a snapshot's sealed environment to its layer
// (a named snapshot's ID stays over its builds; each has its own layer).
func snapshotEnvPurpose(layer string) string { return "snapshot-env:" + layer }

// snapshotName matches a snapshot name, with an optional tag.
var snapshotName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)?(:[a-z0-9][a-z0-9._-]*)?$`)

// CreateSnapshot takes a persistent snapshot of a running sandbox (E2B's
// createSnapshot): its filesystem, as a layer that sandboxes are created
// from by the snapshot's ID or name. A paused or unknown sandbox gives
// api.ErrNotFound (E2B's paused sandboxes are not live).
func (k *Keeper) CreateSnapshot(ctx context.Context, id, name string) (*SnapshotInfo, error) {
	ls, err := k.layerStore()
	if err != nil {
		return nil, err
	}
	tag := "default"
	if name != "" {
		if len(name) > maxSnapshotNameBytes || !snapshotName.MatchString(name) {
			return nil, invalid("snapshot name %q: want lowercase letters, digits, '.', '_', '-', an optional namespace/ and :tag", name)
		}
		if n, t, ok := strings.Cut(name, ":"); ok {
			name, tag = n, t
		}
		if k.HasTemplate(name) {
			return nil, invalid("snapshot name %q is a template's", name)
		}
	}
	l, err := k.running(id, fmt.Errorf("sandbox %q is paused: %w", id, api.ErrNotFound))
	if err != nil {
		return nil, err
	}
	hold, err := k.admitSnapshot(ctx, name)
	if err != nil {
		return nil, err
	}
	defer hold.Done()
	l.Lock()
	defer l.Unlock()
	k.lock.RLock()
	defer k.lock.RUnlock()
	info, err := k.checkpointBox(ctx, l.Box())
	if err != nil {
		return nil, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
	}
	if err := hold.Grow(info.Bytes); err != nil {
		_ = k.layers.DeleteLayer(context.WithoutCancel(ctx), info.ID)
		return nil, err
	}
	snID := strings.ToLower(isolation.NewID())
	var env []byte
	if vars := l.Spec().Agent.EnvVars; k.sealer != nil && len(vars) > 0 {
		raw, _ := json.Marshal(vars)
		if env, err = k.sealer.Seal(ctx, snapshotEnvPurpose(info.ID), raw); err != nil {
			// The snapshot is still good; sandboxes made from it get their
			// create's environment alone.
			k.log.WarnContext(ctx, "sealing the environment of a snapshot", "sandbox_id", id, "err", err)
			env = nil
		}
	}
	src := l.Info()
	spec, _ := json.Marshal(snapshotSpec{CPUs: src.CPUs, MemoryMB: src.MemoryMB, DiskMB: src.DiskMB, Template: src.TemplateID,
		Backend: src.Metadata[sandbox.BackendMetadataKey], Env: env, Memory: info.Memory})
	sn := &store.Snapshot{ID: snID, Name: name, Tag: tag, Layer: info.ID, SandboxID: id,
		Template: l.BaseTemplate(), CreatedAt: k.now().UTC(), Spec: string(spec), Bytes: info.Bytes}
	l.MarkCheckpointed()
	replaced, err := ls.PutSnapshot(context.WithoutCancel(ctx), sn)
	if err != nil {
		_ = k.layers.DeleteLayer(context.WithoutCancel(ctx), info.ID)
		return nil, err
	}
	if replaced != "" {
		k.Collect()
	}
	k.record(ctx, audit.TypeSnapshot, id, map[string]any{"snapshot": sn.ID, "name": name, "files": info.Files, "bytes": info.Bytes})
	return snapshotInfo(sn), nil
}

func snapshotInfo(sn *store.Snapshot) *SnapshotInfo {
	out := &SnapshotInfo{SandboxID: sn.SandboxID, CreatedAt: sn.CreatedAt, Names: []string{}}
	if sn.Name != "" {
		out.SnapshotID = sn.Name + ":" + sn.Tag
		out.Names = []string{sn.Name}
	} else {
		out.SnapshotID = sn.ID + ":" + sn.Tag
	}
	return out
}

// ListSnapshots lists snapshots, newest first, filtered by the sandbox
// they were taken from and by name (an unknown name gives none).
func (k *Keeper) ListSnapshots(ctx context.Context, sandboxID, name string) ([]*SnapshotInfo, error) {
	ls, err := k.layerStore()
	if err != nil {
		return nil, err
	}
	sns, err := ls.ListSnapshots(ctx, sandboxID, name)
	if err != nil {
		return nil, err
	}
	out := make([]*SnapshotInfo, 0, len(sns))
	for _, sn := range sns {
		if _, tag, ok := strings.Cut(name, ":"); ok && tag != sn.Tag {
			continue
		}
		out = append(out, snapshotInfo(sn))
	}
	return out, nil
}

// DeleteSnapshot deletes a snapshot by ID or name (a tag is ignored).
// Sandboxes made from it run on; its layer goes with the last of them.
func (k *Keeper) DeleteSnapshot(ctx context.Context, ref string) error {
	ls, err := k.layerStore()
	if err != nil {
		return err
	}
	sn, err := ls.FindSnapshot(ctx, ref)
	if err != nil {
		return err
	}
	if err := ls.DeleteSnapshot(ctx, sn.ID); err != nil {
		return err
	}
	k.Collect()
	k.record(ctx, audit.TypeSnapshotDelete, sn.SandboxID, map[string]any{"snapshot": sn.ID})
	return nil
}

// HasTemplate reports whether name is an ordinary template's.
func (k *Keeper) HasTemplate(name string) bool {
	if k.templates == nil {
		return false
	}
	_, err := k.templates.Resolve(name)
	return err == nil
}

// IsSnapshot reports whether ref names a snapshot.
func (k *Keeper) IsSnapshot(ctx context.Context, ref string) bool {
	ls := k.store
	if ls == nil {
		return false
	}
	_, err := ls.FindSnapshot(ctx, ref)
	return err == nil
}

// Fork checkpoints a running sandbox and starts count sandboxes on the
// checkpoint (E2B's fork): each gets a new ID and its own envd token, the
// source's template, metadata, environment, network, secret bindings,
// lifecycle and resources, and the timeout d. The source runs on. A
// request-level error (unknown 404, paused 409, bad count 400) returns
// error; otherwise one result per fork, in order.
func (k *Keeper) Fork(ctx context.Context, id string, count int, d time.Duration) ([]ForkResult, error) {
	if _, err := k.layerStore(); err != nil {
		return nil, err
	}
	if count < 1 {
		return nil, invalid("Count must be at least 1")
	}
	if most := k.core.MaxSandboxes(); count > maxForks || count >= most {
		return nil, invalid("Count must be at most %d and less than the limit of %d concurrent sandboxes", maxForks, most)
	}
	if err := k.core.CheckTimeout(d); err != nil {
		return nil, err
	}
	//lint:ignore ST1005 E2B's wording of the error
	paused := fmt.Errorf("Sandbox '%s' is paused and cannot be forked; resume it first: %w", id, api.ErrConflict)
	l, err := k.running(id, paused)
	if err != nil {
		return nil, err
	}
	l.Lock()
	if !l.Running() {
		l.Unlock()
		return nil, paused
	}
	k.lock.RLock()
	defer k.lock.RUnlock()
	info, err := k.checkpointBox(ctx, l.Box())
	l.Unlock()
	if err != nil {
		return nil, fmt.Errorf("forking sandbox %s: %w", id, err)
	}
	src := l.Info()
	req := sandbox.CreateRequest{
		TemplateID: src.TemplateID, Timeout: d, Metadata: maps.Clone(src.Metadata),
		CPUs: src.CPUs, MemoryMB: src.MemoryMB, DiskMB: src.DiskMB,
		AllowInternetAccess: src.AllowInternetAccess,
		Network:             src.Network,
		AutoPause:           src.AutoPause, AutoResume: src.AutoResume, AutoPauseNoMemory: src.AutoPauseNoMemory,
		AutoCheckpoint: src.AutoCheckpoint, IdleTimeout: &src.IdleTimeout,
	}
	// The source's volumes are mounted in its forks, as on E2B; the source
	// holds them meanwhile (a mounted volume cannot be deleted).
	for _, b := range l.Spec().Binds {
		if b.Volume != "" {
			req.Volumes = append(req.Volumes, b)
		}
	}
	out := make([]ForkResult, count)
	sem := make(chan struct{}, forkParallel)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			s, err := k.core.Create(ctx, req, &sandbox.Origin{Layer: info.ID, Template: l.BaseTemplate(), Parent: l,
				Shown: src.TemplateID, Alias: src.Alias, Memory: info.Memory})
			out[i] = ForkResult{Sandbox: s, Err: err}
		})
	}
	wg.Wait()
	k.Collect() // the checkpoint, if no fork started
	k.record(ctx, audit.TypeFork, id, map[string]any{"count": count, "layer": info.ID})
	return out, nil
}
