package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// migrationSSHKeys makes the table of public keys the SSH server accepts.
// A fingerprint is registered once across all teams.
const migrationSSHKeys = `CREATE TABLE ssh_keys (
	id          TEXT PRIMARY KEY,
	team        TEXT NOT NULL DEFAULT '` + tenancy.DefaultTeamID + `',
	name        TEXT NOT NULL,
	public_key  TEXT NOT NULL,
	fingerprint TEXT NOT NULL UNIQUE,
	created_at  INTEGER NOT NULL
)`

// ErrSSHKeyNotFound is the error for an unknown (or another team's) key.
var ErrSSHKeyNotFound = fmt.Errorf("ssh key %w", api.ErrNotFound)

// ErrSSHKeyExists is the error for a fingerprint registered already.
var ErrSSHKeyExists = fmt.Errorf("ssh key %w: this public key is registered already", api.ErrConflict)

// SSHKey is a public key registered for the SSH server.
type SSHKey struct {
	ID          string
	Team        string
	Name        string
	PublicKey   string // authorized_keys form
	Fingerprint string // SHA256:…
	CreatedAt   time.Time
}

// InsertSSHKey stores k; a fingerprint registered already gives
// ErrSSHKeyExists and changes nothing.
func (s *Store) InsertSSHKey(ctx context.Context, k *SSHKey) error {
	var exists bool
	if err := s.shared.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM ssh_keys WHERE fingerprint = ?)`,
		k.Fingerprint).Scan(&exists); err != nil {
		return fmt.Errorf("checking ssh key: %w", err)
	}
	if exists {
		return ErrSSHKeyExists
	}
	if _, err := s.shared.ExecContext(ctx, `INSERT INTO ssh_keys (id, team, name, public_key, fingerprint, created_at)
		VALUES (?, ?, ?, ?, ?, ?)`, k.ID, k.Team, k.Name, k.PublicKey, k.Fingerprint, k.CreatedAt.UnixNano()); err != nil {
		if isUniqueViolation(err) {
			return ErrSSHKeyExists // registered meanwhile (by another node)
		}
		return fmt.Errorf("storing ssh key: %w", err)
	}
	return nil
}

// ListSSHKeys returns team's keys, oldest first.
func (s *Store) ListSSHKeys(ctx context.Context, team string) ([]SSHKey, error) {
	rows, err := s.shared.QueryContext(ctx, `SELECT id, team, name, public_key, fingerprint, created_at
		FROM ssh_keys WHERE team = ? ORDER BY created_at, id`, team)
	if err != nil {
		return nil, fmt.Errorf("listing ssh keys: %w", err)
	}
	defer rows.Close()
	var out []SSHKey
	for rows.Next() {
		k, err := scanSSHKey(rows.Scan)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// SSHKeyByFingerprint returns the key with fingerprint, or ErrSSHKeyNotFound.
func (s *Store) SSHKeyByFingerprint(ctx context.Context, fingerprint string) (SSHKey, error) {
	k, err := scanSSHKey(s.shared.QueryRowContext(ctx, `SELECT id, team, name, public_key, fingerprint, created_at
		FROM ssh_keys WHERE fingerprint = ?`, fingerprint).Scan)
	if errors.Is(err, sql.ErrNoRows) {
		return SSHKey{}, ErrSSHKeyNotFound
	}
	return k, err
}

// DeleteSSHKey removes team's key id, or gives ErrSSHKeyNotFound.
func (s *Store) DeleteSSHKey(ctx context.Context, team, id string) error {
	res, err := s.shared.ExecContext(ctx, `DELETE FROM ssh_keys WHERE id = ? AND team = ?`, id, team)
	if err != nil {
		return fmt.Errorf("deleting ssh key: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrSSHKeyNotFound
	}
	return nil
}

func scanSSHKey(scan func(...any) error) (SSHKey, error) {
	var k SSHKey
	var created int64
	if err := scan(&k.ID, &k.Team, &k.Name, &k.PublicKey, &k.Fingerprint, &created); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return k, err
		}
		return k, fmt.Errorf("reading ssh key: %w", err)
	}
	k.CreatedAt = time.Unix(0, created)
	return k, nil
}
