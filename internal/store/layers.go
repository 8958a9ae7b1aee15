package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
)

const migrationLayers = `CREATE TABLE snapshots (
		id         TEXT PRIMARY KEY,   -- the snapshot template's ID
		name       TEXT UNIQUE,        -- NULL when unnamed
		tag        TEXT NOT NULL,
		layer      TEXT NOT NULL,      -- the backend's layer
		sandbox_id TEXT NOT NULL,      -- taken from
		template   TEXT NOT NULL,      -- the template the layer sits on
		created_at INTEGER NOT NULL,   -- unix nanoseconds
		spec       TEXT NOT NULL DEFAULT '{}' -- resources of the source, JSON
	);
	CREATE INDEX snapshots_created ON snapshots (created_at DESC, id DESC);
	CREATE TABLE checkpoints (
		id         TEXT PRIMARY KEY,
		sandbox_id TEXT NOT NULL,
		layer      TEXT NOT NULL,
		name       TEXT NOT NULL DEFAULT '',
		auto       INTEGER NOT NULL DEFAULT 0,
		files      INTEGER NOT NULL DEFAULT 0,
		bytes      INTEGER NOT NULL DEFAULT 0,
		created_at INTEGER NOT NULL
	);
	CREATE INDEX checkpoints_sandbox ON checkpoints (sandbox_id, created_at);`

// Snapshot is a persistent snapshot: a layer and what a sandbox made
// from it boots with.
type Snapshot struct {
	ID        string
	Name      string // "" when unnamed
	Tag       string
	Layer     string
	SandboxID string
	Template  string
	CreatedAt time.Time
	Spec      string // JSON, the caller's
	// Team owns the snapshot; PutSnapshot sets the team of its context
	// when empty. Names are unique within a team.
	Team string
	// Bytes is what its layer holds of its own, counted against its
	// team's snapshot disk (SnapshotUsage).
	Bytes int64
}

// PutSnapshot records a snapshot. A named one replaces the snapshot of
// the same name (a new build of it: same ID, new layer) and returns the
// layer it replaced ("" if none).
func (s *Store) PutSnapshot(ctx context.Context, sn *Snapshot) (replaced string, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	sn.Team = ownerOf(ctx, sn.Team)
	var name any
	if sn.Name != "" {
		name = sn.Name
		var id, layer string
		err := tx.QueryRowContext(ctx, `SELECT id, layer FROM snapshots WHERE name = ? AND team = ?`, sn.Name, sn.Team).Scan(&id, &layer)
		switch {
		case err == nil:
			sn.ID, replaced = id, layer
			if _, err := tx.ExecContext(ctx, `UPDATE snapshots SET tag=?, layer=?, sandbox_id=?, template=?, created_at=?, spec=?, bytes=? WHERE id=?`,
				sn.Tag, sn.Layer, sn.SandboxID, sn.Template, sn.CreatedAt.UnixNano(), sn.Spec, sn.Bytes, id); err != nil {
				return "", fmt.Errorf("updating snapshot: %w", err)
			}
			return replaced, tx.Commit()
		case !errors.Is(err, sql.ErrNoRows):
			return "", fmt.Errorf("reading snapshot: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO snapshots (id, name, tag, layer, sandbox_id, template, created_at, spec, team, bytes) VALUES (?,?,?,?,?,?,?,?,?,?)`,
		sn.ID, name, sn.Tag, sn.Layer, sn.SandboxID, sn.Template, sn.CreatedAt.UnixNano(), sn.Spec, sn.Team, sn.Bytes); err != nil {
		return "", fmt.Errorf("inserting snapshot: %w", err)
	}
	return "", tx.Commit()
}

const snapshotCols = `id, COALESCE(name, ''), tag, layer, sandbox_id, template, created_at, spec, team`

func scanSnapshot(r scanner) (*Snapshot, error) {
	var sn Snapshot
	var created int64
	if err := r.Scan(&sn.ID, &sn.Name, &sn.Tag, &sn.Layer, &sn.SandboxID, &sn.Template, &created, &sn.Spec, &sn.Team); err != nil {
		return nil, err
	}
	sn.CreatedAt = time.Unix(0, created).UTC()
	return &sn, nil
}

// FindSnapshot returns the snapshot whose ID or name is ref (a tag after
// a colon is ignored), or an error wrapping api.ErrNotFound (also for
// another team's when ctx acts for a principal, as ListSnapshots and
// DeleteSnapshot).
func (s *Store) FindSnapshot(ctx context.Context, ref string) (*Snapshot, error) {
	return findSnapshot(ctx, s.db, "snapshots", snapshotCols, ref, scanSnapshot)
}

// ListSnapshots lists snapshots, newest first; sandboxID and name
// (matched as FindSnapshot does) filter when not empty.
func (s *Store) ListSnapshots(ctx context.Context, sandboxID, name string) ([]*Snapshot, error) {
	return listSnapshots(ctx, s.db, "snapshots", snapshotCols, sandboxID, name, scanSnapshot)
}

// findSnapshot is FindSnapshot over table (snapshots or
// shared_snapshots) of e, its columns cols read by scan.
func findSnapshot[T any](ctx context.Context, e *engine, table, cols, ref string, scan func(scanner) (T, error)) (T, error) {
	base, _, _ := strings.Cut(ref, ":")
	cond, args := scope(ctx, table)
	sn, err := scan(e.QueryRowContext(ctx, `SELECT `+cols+` FROM `+table+` WHERE (id = ? OR name = ?) AND `+cond,
		append([]any{base, base}, args...)...))
	if errors.Is(err, sql.ErrNoRows) {
		return sn, fmt.Errorf("snapshot %q: %w", ref, api.ErrNotFound)
	}
	return sn, err
}

// listSnapshots is ListSnapshots over table of e, as findSnapshot.
func listSnapshots[T any](ctx context.Context, e *engine, table, cols, sandboxID, name string, scan func(scanner) (T, error)) ([]T, error) {
	cond, args := scope(ctx, table)
	q := `SELECT ` + cols + ` FROM ` + table + ` WHERE ` + cond
	if sandboxID != "" {
		q += ` AND sandbox_id = ?`
		args = append(args, sandboxID)
	}
	if name != "" {
		base, _, _ := strings.Cut(name, ":")
		q += ` AND (name = ? OR id = ?)`
		args = append(args, base, base)
	}
	rows, err := e.QueryContext(ctx, q+` ORDER BY created_at DESC, id DESC`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		sn, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// DeleteSnapshot removes a snapshot, or returns an error wrapping
// api.ErrNotFound.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	cond, args := scope(ctx, "snapshots")
	res, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ? AND `+cond, append([]any{id}, args...)...)
	return checkOne(res, err, "deleting snapshot "+id)
}

// Checkpoint is one checkpoint of a sandbox.
type Checkpoint struct {
	ID        string
	SandboxID string
	Layer     string
	Name      string
	Auto      bool
	Files     int
	Bytes     int64
	CreatedAt time.Time
}

// InsertCheckpoint records a checkpoint.
func (s *Store) InsertCheckpoint(ctx context.Context, c *Checkpoint) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO checkpoints (id, sandbox_id, layer, name, auto, files, bytes, created_at) VALUES (?,?,?,?,?,?,?,?)`,
		c.ID, c.SandboxID, c.Layer, c.Name, c.Auto, c.Files, c.Bytes, c.CreatedAt.UnixNano())
	if err != nil {
		return fmt.Errorf("inserting checkpoint: %w", err)
	}
	return nil
}

// Checkpoints lists a sandbox's checkpoints, oldest first ("" lists every
// sandbox's).
func (s *Store) Checkpoints(ctx context.Context, sandboxID string) ([]*Checkpoint, error) {
	q := `SELECT id, sandbox_id, layer, name, auto, files, bytes, created_at FROM checkpoints`
	var args []any
	if sandboxID != "" {
		q += ` WHERE sandbox_id = ?`
		args = append(args, sandboxID)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Checkpoint
	for rows.Next() {
		var c Checkpoint
		var created int64
		if err := rows.Scan(&c.ID, &c.SandboxID, &c.Layer, &c.Name, &c.Auto, &c.Files, &c.Bytes, &created); err != nil {
			return nil, err
		}
		c.CreatedAt = time.Unix(0, created).UTC()
		out = append(out, &c)
	}
	return out, rows.Err()
}

// DeleteCheckpoints removes checkpoints: one by ID, or every one of a
// sandbox when id is empty.
func (s *Store) DeleteCheckpoints(ctx context.Context, sandboxID, id string) error {
	if id != "" {
		res, err := s.db.ExecContext(ctx, `DELETE FROM checkpoints WHERE sandbox_id = ? AND id = ?`, sandboxID, id)
		return checkOne(res, err, "deleting checkpoint "+id)
	}
	_, err := s.db.ExecContext(ctx, `DELETE FROM checkpoints WHERE sandbox_id = ?`, sandboxID)
	return err
}

// DeleteOrphanCheckpoints removes the checkpoints of sandboxes that are
// not running or paused (after a restart, all of them).
func (s *Store) DeleteOrphanCheckpoints(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM checkpoints WHERE sandbox_id NOT IN (SELECT id FROM sandboxes WHERE state IN ('running', 'paused'))`)
	return err
}
