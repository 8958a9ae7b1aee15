package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/store"
)

// Moves between nodes (a drained node's sandboxes resumed on another,
// internal/snapreg): a sandbox leaves its node in a pause on a layer
// (Depart) holding its filesystem, and on gvisor its memory and processes
// too, as its record and its sealed resume data (coldRecord) with that
// layer; the caller carries the layer to the other node, which takes the
// sandbox over, paused, under the same ID (Arrive) exactly as a daemon
// takes over a filesystem-only pause its previous run left
// (adopter.adoptCold); its next resume or connect boots it there, on the
// layer (a gvisor restore: its processes go on). The sealed data opens on
// every node of a cluster (they share the sealing key).

// Departure is what a sandbox's move to another node carries, besides
// its layers.
type Departure struct {
	// Record is the sandbox's record, paused.
	Record store.Sandbox
	// Cold is its sealed resume data (ColdStore.ColdResume).
	Cold []byte
	// Layer is its pause's layer; Template the template it sits on.
	Layer, Template string
}

// Depart pauses running sandbox id on a layer (its files; on gvisor its
// memory and processes too), for a move to another node, and returns
// what the move carries; the sandbox stays here, paused, until Gone. A
// sandbox already paused on a layer departs as it is. A sandbox paused in
// place with its memory, mounting volumes (they are this node's), or
// without resume data (no sealer) cannot depart: an error wrapping
// api.ErrFailedPrecondition, and nothing changes.
func (p *Pauses) Depart(ctx context.Context, id string) (*Departure, error) {
	e, err := ownedLookup(ctx, p.core, id)
	if err != nil {
		return nil, err
	}
	if p.cold.cold == nil || p.cold.sealer == nil {
		return nil, fmt.Errorf("sandbox %s cannot move: this node keeps no resume data: %w", id, api.ErrFailedPrecondition)
	}
	if len(volumeBinds(e.spec.Binds)) > 0 {
		return nil, fmt.Errorf("sandbox %s mounts volumes of this node and cannot move: %w", id, api.ErrFailedPrecondition)
	}
	if e.state() == StateRunning {
		if err := p.pauseOnLayer(ctx, id, "move", p.wholeCheckpoint); err != nil && !errors.Is(err, errNotRunning) {
			return nil, err
		}
	}
	e.life.Lock()
	defer e.life.Unlock()
	if e.state() != StatePaused || !e.isCold() {
		return nil, fmt.Errorf("sandbox %s is paused with its memory and cannot move: %w", id, api.ErrFailedPrecondition)
	}
	m := p.core.(pauseHost).m
	rec, err := m.store.(interface {
		Get(ctx context.Context, id string) (*store.Sandbox, error)
	}).Get(context.WithoutCancel(ctx), id)
	if err != nil {
		return nil, err
	}
	data, err := p.cold.cold.ColdResume(context.WithoutCancel(ctx), id)
	if err != nil {
		return nil, err
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("sandbox %s has no resume data and cannot move: %w", id, api.ErrFailedPrecondition)
	}
	return &Departure{Record: *rec, Cold: data, Layer: e.coldLayer(), Template: e.baseTemplate}, nil
}

// wholeCheckpoint is the layer of a moving sandbox: with its memory and
// processes where the backend's checkpoints keep them (gvisor: the
// resume on the other node restores them), else its filesystem.
func (p *Pauses) wholeCheckpoint(ctx context.Context, box isolation.Sandbox) (isolation.LayerInfo, error) {
	_, files := isolation.As[isolation.FileCheckpointer](box)
	cp, ok := isolation.As[isolation.Checkpointer](box)
	if !ok || !files {
		return p.keeper.CheckpointFiles(ctx, box)
	}
	info, err := cp.Checkpoint(ctx)
	if errors.Is(err, isolation.ErrLayerBudget) {
		err = fmt.Errorf("%w: %w", err, api.ErrResourceExhausted)
	}
	return info, err
}

// Gone forgets sandbox id, moved to another node: it is killed here (its
// record marked so, its layer collected once nothing keeps it), with
// reason "moved".
func (p *Pauses) Gone(ctx context.Context, id string) error {
	return p.core.(pauseHost).m.kill(ctx, id, "moved")
}

// Arrive takes over sandbox d.Record.ID, moved here, paused: d.Layer (and
// the layers below it) must be here already. Its resume data is sealed
// again with the template's root on this node. On an error nothing of it
// is left here (its record, if written, is marked killed).
func (p *Pauses) Arrive(ctx context.Context, d *Departure) error {
	m := p.core.(pauseHost).m
	id := d.Record.ID
	if !api.ValidSandboxID(id) {
		return fmt.Errorf("sandbox id %q: %w", id, api.ErrInvalidArgument)
	}
	if p.cold.cold == nil || p.cold.sealer == nil {
		return fmt.Errorf("sandbox %s cannot move here: this node keeps no resume data: %w", id, api.ErrFailedPrecondition)
	}
	if _, err := m.lookup(id); err == nil {
		return fmt.Errorf("sandbox %s is already here: %w", id, api.ErrConflict)
	}
	raw, err := p.cold.sealer.Unseal(ctx, coldPurpose(id), d.Cold)
	if err != nil {
		return fmt.Errorf("opening the resume data of sandbox %s: %w", id, err)
	}
	var cr coldRecord
	if err := json.Unmarshal(raw, &cr); err != nil {
		return fmt.Errorf("reading the resume data of sandbox %s: %w", id, err)
	}
	if cr.Layer != d.Layer {
		return fmt.Errorf("sandbox %s: its resume data names layer %q, the move %q: %w", id, cr.Layer, d.Layer, api.ErrInvalidArgument)
	}
	if cr.Spec.RootFS, err = m.templates.Resolve(cr.BaseTemplate); err != nil {
		return fmt.Errorf("sandbox %s runs on template %q, which this node does not have: %w", id, cr.BaseTemplate, err)
	}
	raw, _ = json.Marshal(cr)
	sealed, err := p.cold.sealer.Seal(ctx, coldPurpose(id), raw)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	rec := d.Record
	rec.State, rec.Slot = store.StateRunning, 0 // the slot was the other node's
	if err := m.store.Insert(ctx, &rec); errors.Is(err, api.ErrConflict) {
		// Back on a node it left: its killed record runs again.
		err = m.store.Transition(ctx, id, store.StateKilled, store.StateRunning, rec.CreatedAt, rec.EndAt)
		if err != nil {
			return fmt.Errorf("recording sandbox %s: %w", id, err)
		}
	} else if err != nil {
		return fmt.Errorf("recording sandbox %s: %w", id, err)
	}
	if err := p.cold.cold.PauseCold(ctx, id, store.StateRunning, rec.CreatedAt, rec.EndAt, sealed); err != nil {
		markKilled(ctx, m.store, m.log, id)
		return err
	}
	rec.State = store.StatePaused
	if !m.adopter.adoptCold(ctx, &rec) {
		markKilled(ctx, m.store, m.log, id)
		return fmt.Errorf("taking over sandbox %s moved here failed (see the log)", id)
	}
	m.record(ctx, "sandbox.arrive", id, map[string]any{"layer": d.Layer, "paused_at": rec.EndAt.Format(time.RFC3339)})
	return nil
}
