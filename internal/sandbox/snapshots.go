package sandbox

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
	Sandbox *Sandbox
	Err     error
}

// snapshotOrigin resolves a create's template to a snapshot, or nil for a
// template (ordinary templates first).
func (m *Manager) snapshotOrigin(ctx context.Context, ref string) (*origin, error) {
	ls, ok := m.store.(LayerStore)
	if !ok || m.layers == nil || ref == "" {
		return nil, nil
	}
	if _, err := m.templates.Resolve(ref); err == nil {
		return nil, nil
	}
	sn, err := ls.FindSnapshot(ctx, ref)
	if err != nil {
		if errors.Is(err, api.ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	var spec snapshotSpec
	_ = json.Unmarshal([]byte(sn.Spec), &spec) // older records lack fields
	var env map[string]string
	if len(spec.Env) > 0 && m.sealer != nil {
		raw, err := m.sealer.Unseal(ctx, snapshotEnvPurpose(sn.Layer), spec.Env)
		if err == nil {
			err = json.Unmarshal(raw, &env)
		}
		if err != nil { // a lost key: the create's environment alone
			m.log.WarnContext(ctx, "opening the environment of a snapshot", "snapshot", sn.ID, "err", err)
			env = nil
		}
	}
	return &origin{layer: sn.Layer, template: sn.Template, shown: sn.ID, alias: sn.Name, backend: spec.Backend, env: env,
		memory: spec.Memory}, nil
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
func (m *Manager) CreateSnapshot(ctx context.Context, id, name string) (*SnapshotInfo, error) {
	ls, err := m.layerStore()
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
		if _, err := m.templates.Resolve(name); err == nil {
			return nil, invalid("snapshot name %q is a template's", name)
		}
	}
	e, err := m.runningEntry(id, fmt.Errorf("sandbox %q is paused: %w", id, api.ErrNotFound))
	if err != nil {
		return nil, err
	}
	e.life.Lock()
	defer e.life.Unlock()
	m.layerMu.RLock()
	defer m.layerMu.RUnlock()
	info, err := m.checkpointBox(ctx, e)
	if err != nil {
		return nil, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
	}
	snID := strings.ToLower(isolation.NewID())
	var env []byte
	if m.sealer != nil && len(e.spec.Agent.EnvVars) > 0 {
		raw, _ := json.Marshal(e.spec.Agent.EnvVars)
		if env, err = m.sealer.Seal(ctx, snapshotEnvPurpose(info.ID), raw); err != nil {
			// The snapshot is still good; sandboxes made from it get their
			// create's environment alone.
			m.log.WarnContext(ctx, "sealing the environment of a snapshot", "sandbox_id", id, "err", err)
			env = nil
		}
	}
	e.mu.Lock()
	spec, _ := json.Marshal(snapshotSpec{CPUs: e.info.CPUs, MemoryMB: e.info.MemoryMB, DiskMB: e.info.DiskMB, Template: e.info.TemplateID,
		Backend: e.info.Metadata[BackendMetadataKey], Env: env, Memory: info.Memory})
	e.mu.Unlock()
	sn := &store.Snapshot{ID: snID, Name: name, Tag: tag, Layer: info.ID, SandboxID: id,
		Template: e.baseTemplate, CreatedAt: m.now().UTC(), Spec: string(spec)}
	e.checkpointed.Store(true)
	replaced, err := ls.PutSnapshot(context.WithoutCancel(ctx), sn)
	if err != nil {
		_ = m.layers.DeleteLayer(context.WithoutCancel(ctx), info.ID)
		return nil, err
	}
	if replaced != "" {
		m.nudgeGC()
	}
	m.record(ctx, audit.TypeSnapshot, id, map[string]any{"snapshot": sn.ID, "name": name, "files": info.Files, "bytes": info.Bytes})
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
func (m *Manager) ListSnapshots(ctx context.Context, sandboxID, name string) ([]*SnapshotInfo, error) {
	ls, err := m.layerStore()
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
func (m *Manager) DeleteSnapshot(ctx context.Context, ref string) error {
	ls, err := m.layerStore()
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
	m.nudgeGC()
	m.record(ctx, audit.TypeSnapshotDelete, sn.SandboxID, map[string]any{"snapshot": sn.ID})
	return nil
}

// HasTemplate reports whether name is an ordinary template's.
func (m *Manager) HasTemplate(name string) bool {
	_, err := m.templates.Resolve(name)
	return err == nil
}

// IsSnapshot reports whether ref names a snapshot.
func (m *Manager) IsSnapshot(ctx context.Context, ref string) bool {
	ls, ok := m.store.(LayerStore)
	if !ok {
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
func (m *Manager) Fork(ctx context.Context, id string, count int, d time.Duration) ([]ForkResult, error) {
	if _, err := m.layerStore(); err != nil {
		return nil, err
	}
	if count < 1 {
		return nil, invalid("Count must be at least 1")
	}
	if count > maxForks || count >= m.max {
		return nil, invalid("Count must be at most %d and less than the limit of %d concurrent sandboxes", maxForks, m.max)
	}
	if err := checkTimeout(d, m.maxTimeout); err != nil {
		return nil, err
	}
	e, err := m.runningEntry(id, fmt.Errorf("Sandbox '%s' is paused and cannot be forked; resume it first: %w", id, api.ErrConflict))
	if err != nil {
		return nil, err
	}
	e.life.Lock()
	if e.state() != StateRunning {
		e.life.Unlock()
		return nil, fmt.Errorf("Sandbox '%s' is paused and cannot be forked; resume it first: %w", id, api.ErrConflict)
	}
	m.layerMu.RLock()
	defer m.layerMu.RUnlock()
	info, err := m.checkpointBox(ctx, e)
	e.life.Unlock()
	if err != nil {
		return nil, fmt.Errorf("forking sandbox %s: %w", id, err)
	}
	src := e.snapshot()
	req := CreateRequest{
		TemplateID: src.TemplateID, Timeout: d, Metadata: maps.Clone(src.Metadata),
		CPUs: src.CPUs, MemoryMB: src.MemoryMB, DiskMB: src.DiskMB,
		AllowInternetAccess: src.AllowInternetAccess,
		Network:             src.Network,
		AutoPause:           src.AutoPause, AutoResume: src.AutoResume, AutoPauseNoMemory: src.AutoPauseNoMemory,
		AutoCheckpoint: src.AutoCheckpoint,
	}
	out := make([]ForkResult, count)
	sem := make(chan struct{}, forkParallel)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			s, err := m.create(ctx, req, &origin{layer: info.ID, template: e.baseTemplate, parent: e,
				shown: src.TemplateID, alias: src.Alias, memory: info.Memory})
			out[i] = ForkResult{Sandbox: s, Err: err}
		})
	}
	wg.Wait()
	m.nudgeGC() // the checkpoint, if no fork started
	m.record(ctx, audit.TypeFork, id, map[string]any{"count": count, "layer": info.ID})
	return out, nil
}
