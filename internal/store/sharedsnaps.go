package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// migrationSharedSnapshots keeps the snapshots whose layers are in the
// cluster's OCI registry (internal/snapreg): any node resumes them, so
// their index is a shared record. Each row names its layers (top first)
// with the manifest digest each was pushed as; a row is written only
// after every layer of it is in the registry.
const migrationSharedSnapshots = `CREATE TABLE shared_snapshots (
		id         TEXT PRIMARY KEY,
		team       TEXT NOT NULL,
		name       TEXT,             -- NULL when unnamed; unique in its team
		tag        TEXT NOT NULL,
		layer      TEXT NOT NULL,    -- the top layer's ID (the same on every node)
		sandbox_id TEXT NOT NULL,    -- taken from
		template   TEXT NOT NULL,    -- the template the layers sit on
		backend    TEXT NOT NULL,
		node       TEXT NOT NULL,    -- the node that took it
		digest     TEXT NOT NULL,    -- the top layer's manifest digest
		chain      TEXT NOT NULL,    -- JSON: [{layer, digest}], top first
		spec       TEXT NOT NULL,
		bytes      INTEGER NOT NULL,
		created_at INTEGER NOT NULL, -- unix nanoseconds
		UNIQUE (team, name)
	);
	CREATE INDEX shared_snapshots_created ON shared_snapshots (created_at DESC, id DESC)`

// LayerRef is one layer of a shared snapshot and the manifest digest it
// was pushed to the registry as.
type LayerRef struct {
	Layer  string `json:"layer"`
	Digest string `json:"digest"`
}

// SharedSnapshot is a snapshot whose layers are in the cluster's
// registry: Snapshot's fields, and where its content is.
type SharedSnapshot struct {
	Snapshot
	Backend string
	Node    string
	// Digest is Chain[0]'s.
	Digest string
	// Chain is the snapshot's layers, top (Snapshot.Layer) first.
	Chain []LayerRef
}

const sharedSnapshotCols = `id, COALESCE(name, ''), tag, layer, sandbox_id, template, created_at, spec, team, bytes, backend, node, digest, chain`

func scanSharedSnapshot(r scanner) (*SharedSnapshot, error) {
	var sn SharedSnapshot
	var created int64
	var chain string
	if err := r.Scan(&sn.ID, &sn.Name, &sn.Tag, &sn.Layer, &sn.SandboxID, &sn.Template, &created, &sn.Spec, &sn.Team,
		&sn.Bytes, &sn.Backend, &sn.Node, &sn.Digest, &chain); err != nil {
		return nil, err
	}
	sn.CreatedAt = time.Unix(0, created).UTC()
	if err := json.Unmarshal([]byte(chain), &sn.Chain); err != nil {
		return nil, fmt.Errorf("snapshot %s: reading its layers: %w", sn.ID, err)
	}
	return &sn, nil
}

// PutSharedSnapshot records a shared snapshot, as PutSnapshot does a
// node's: a named one replaces the team's snapshot of that name (same
// ID, new layers) and returns the top layer it replaced ("" if none).
func (s *Store) PutSharedSnapshot(ctx context.Context, sn *SharedSnapshot) (replaced string, err error) {
	if len(sn.Chain) == 0 || sn.Chain[0].Layer != sn.Layer || sn.Chain[0].Digest != sn.Digest {
		return "", fmt.Errorf("snapshot %s: its chain must start with its layer and digest: %w", sn.ID, api.ErrInvalidArgument)
	}
	chain, err := json.Marshal(sn.Chain)
	if err != nil {
		return "", err
	}
	tx, err := s.shared.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	sn.Team = ownerOf(ctx, sn.Team)
	var name any
	if sn.Name != "" {
		name = sn.Name
		var id, layer string
		err := tx.QueryRowContext(ctx, `SELECT id, layer FROM shared_snapshots WHERE name = ? AND team = ?`, sn.Name, sn.Team).Scan(&id, &layer)
		switch {
		case err == nil:
			sn.ID, replaced = id, layer
			if _, err := tx.ExecContext(ctx, `UPDATE shared_snapshots SET tag=?, layer=?, sandbox_id=?, template=?, created_at=?, spec=?,
				bytes=?, backend=?, node=?, digest=?, chain=? WHERE id=?`,
				sn.Tag, sn.Layer, sn.SandboxID, sn.Template, sn.CreatedAt.UnixNano(), sn.Spec, sn.Bytes, sn.Backend, sn.Node,
				sn.Digest, string(chain), id); err != nil {
				return "", fmt.Errorf("updating shared snapshot: %w", err)
			}
			return replaced, tx.Commit()
		case !errors.Is(err, sql.ErrNoRows):
			return "", fmt.Errorf("reading shared snapshot: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO shared_snapshots (`+strings.ReplaceAll(sharedSnapshotCols, "COALESCE(name, '')", "name")+`)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		sn.ID, name, sn.Tag, sn.Layer, sn.SandboxID, sn.Template, sn.CreatedAt.UnixNano(), sn.Spec, sn.Team, sn.Bytes,
		sn.Backend, sn.Node, sn.Digest, string(chain)); err != nil {
		return "", fmt.Errorf("inserting shared snapshot: %w", err)
	}
	return "", tx.Commit()
}

// FindSharedSnapshot returns the shared snapshot whose ID or name is ref
// (a tag after a colon is ignored), or an error wrapping api.ErrNotFound
// (also for another team's when ctx acts for a principal).
func (s *Store) FindSharedSnapshot(ctx context.Context, ref string) (*SharedSnapshot, error) {
	return findSnapshot(ctx, s.shared, "shared_snapshots", sharedSnapshotCols, ref, scanSharedSnapshot)
}

// ListSharedSnapshots lists shared snapshots, newest first; sandboxID
// and name (matched as FindSharedSnapshot does) filter when not empty.
func (s *Store) ListSharedSnapshots(ctx context.Context, sandboxID, name string) ([]*SharedSnapshot, error) {
	return listSnapshots(ctx, s.shared, "shared_snapshots", sharedSnapshotCols, sandboxID, name, scanSharedSnapshot)
}

// DeleteSharedSnapshot removes a shared snapshot's record, or returns an
// error wrapping api.ErrNotFound.
func (s *Store) DeleteSharedSnapshot(ctx context.Context, id string) error {
	cond, args := scope(ctx, "shared_snapshots")
	res, err := s.shared.ExecContext(ctx, `DELETE FROM shared_snapshots WHERE id = ? AND `+cond, append([]any{id}, args...)...)
	return checkAffected(res, err, "deleting snapshot "+id, api.ErrNotFound)
}

// SharedSnapshotUsage is SnapshotUsage over the shared snapshots.
func (s *Store) SharedSnapshotUsage(ctx context.Context, team, except string) (tenancy.Kept, error) {
	var k tenancy.Kept
	if err := s.shared.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM shared_snapshots
		WHERE team = ? AND (? = '' OR name IS NULL OR name <> ?)`, team, except, except).Scan(&k.Count, &k.Bytes); err != nil {
		return k, fmt.Errorf("counting the snapshots of team %s: %w", team, err)
	}
	return k, nil
}
