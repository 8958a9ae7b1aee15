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

// migrationVolumes makes the tables of volumes (a team's named,
// size-limited storage that outlives sandboxes) and of the sandboxes that
// mount them. A name is unique within its team.
const migrationVolumes = `CREATE TABLE volumes (
	id         TEXT PRIMARY KEY,
	team       TEXT NOT NULL,
	name       TEXT NOT NULL,
	size_bytes INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	UNIQUE (team, name)
);
CREATE TABLE volume_mounts (
	sandbox_id TEXT NOT NULL,
	volume_id  TEXT NOT NULL,
	path       TEXT NOT NULL,
	PRIMARY KEY (sandbox_id, path)
);
CREATE INDEX volume_mounts_volume ON volume_mounts (volume_id)`

// ErrVolumeNotFound is the error for an unknown (or another team's)
// volume.
var ErrVolumeNotFound = fmt.Errorf("volume %w", api.ErrNotFound)

// ErrVolumeExists is the error for a name the team uses already.
var ErrVolumeExists = errors.New("volume name taken")

// Volume is a team's volume.
type Volume struct {
	ID        string
	Team      string
	Name      string
	SizeBytes int64
	CreatedAt time.Time
}

// VolumeMount is a volume mounted into a sandbox at Path.
type VolumeMount struct {
	SandboxID string
	VolumeID  string
	Name      string
	Path      string
}

// InsertVolume stores v; a name its team uses already gives
// ErrVolumeExists and changes nothing.
func (s *Store) InsertVolume(ctx context.Context, v *Volume) error {
	res, err := s.db.ExecContext(ctx, `INSERT INTO volumes (id, team, name, size_bytes, created_at)
		VALUES (?, ?, ?, ?, ?) ON CONFLICT (team, name) DO NOTHING`,
		v.ID, v.Team, v.Name, v.SizeBytes, v.CreatedAt.Unix())
	if err != nil {
		return fmt.Errorf("storing volume: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrVolumeExists
	}
	return nil
}

// Volumes returns team's volumes ("" for every team's), oldest first.
func (s *Store) Volumes(ctx context.Context, team string) ([]Volume, error) {
	q := `SELECT id, team, name, size_bytes, created_at FROM volumes`
	var args []any
	if team != "" {
		q += ` WHERE team = ?`
		args = append(args, team)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing volumes: %w", err)
	}
	defer rows.Close()
	out := []Volume{}
	for rows.Next() {
		v, err := scanVolume(rows.Scan)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// VolumeByID returns team's volume id, or ErrVolumeNotFound (also for
// another team's).
func (s *Store) VolumeByID(ctx context.Context, team, id string) (Volume, error) {
	return s.volumeWhere(ctx, `id = ? AND team = ?`, id, team)
}

// VolumeByName returns team's volume named name, or ErrVolumeNotFound.
func (s *Store) VolumeByName(ctx context.Context, team, name string) (Volume, error) {
	return s.volumeWhere(ctx, `name = ? AND team = ?`, name, team)
}

func (s *Store) volumeWhere(ctx context.Context, where string, args ...any) (Volume, error) {
	v, err := scanVolume(s.db.QueryRowContext(ctx, `SELECT id, team, name, size_bytes, created_at
		FROM volumes WHERE `+where, args...).Scan)
	if errors.Is(err, sql.ErrNoRows) {
		return Volume{}, ErrVolumeNotFound
	}
	return v, err
}

// DeleteVolume removes team's volume id and its mount records, or gives
// ErrVolumeNotFound.
func (s *Store) DeleteVolume(ctx context.Context, team, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("deleting volume: %w", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `DELETE FROM volumes WHERE id = ? AND team = ?`, id, team)
	if err != nil {
		return fmt.Errorf("deleting volume: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrVolumeNotFound
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM volume_mounts WHERE volume_id = ?`, id); err != nil {
		return fmt.Errorf("deleting volume: %w", err)
	}
	return tx.Commit()
}

// InsertVolumeMounts records that sandbox mounts the volumes of ms.
func (s *Store) InsertVolumeMounts(ctx context.Context, sandbox string, ms []VolumeMount) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("recording volume mounts: %w", err)
	}
	defer tx.Rollback()
	for _, m := range ms {
		if _, err := tx.ExecContext(ctx, `INSERT INTO volume_mounts (sandbox_id, volume_id, path) VALUES (?, ?, ?)
			ON CONFLICT (sandbox_id, path) DO UPDATE SET volume_id = excluded.volume_id`, sandbox, m.VolumeID, m.Path); err != nil {
			return fmt.Errorf("recording volume mounts: %w", err)
		}
	}
	return tx.Commit()
}

// VolumeMountsOf returns the volumes the sandboxes ids mount, by path
// within each sandbox.
func (s *Store) VolumeMountsOf(ctx context.Context, ids ...string) ([]VolumeMount, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	rows, err := s.db.QueryContext(ctx, `SELECT m.sandbox_id, m.volume_id, v.name, m.path
		FROM volume_mounts m JOIN volumes v ON v.id = m.volume_id
		WHERE m.sandbox_id IN (?`+strings.Repeat(", ?", len(ids)-1)+`) ORDER BY m.sandbox_id, m.path`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing volume mounts: %w", err)
	}
	defer rows.Close()
	var out []VolumeMount
	for rows.Next() {
		var m VolumeMount
		if err := rows.Scan(&m.SandboxID, &m.VolumeID, &m.Name, &m.Path); err != nil {
			return nil, fmt.Errorf("reading volume mount: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// VolumeUsers returns the sandboxes, running or paused, that mount volume
// id.
func (s *Store) VolumeUsers(ctx context.Context, id string) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT DISTINCT m.sandbox_id FROM volume_mounts m
		JOIN sandboxes s ON s.id = m.sandbox_id
		WHERE m.volume_id = ? AND s.state IN (?, ?) ORDER BY m.sandbox_id`, id, StateRunning, StatePaused)
	if err != nil {
		return nil, fmt.Errorf("listing volume users: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var sb string
		if err := rows.Scan(&sb); err != nil {
			return nil, fmt.Errorf("reading volume user: %w", err)
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

func scanVolume(scan func(...any) error) (Volume, error) {
	var v Volume
	var created int64
	if err := scan(&v.ID, &v.Team, &v.Name, &v.SizeBytes, &created); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return v, err
		}
		return v, fmt.Errorf("reading volume: %w", err)
	}
	v.CreatedAt = time.Unix(created, 0)
	return v, nil
}
