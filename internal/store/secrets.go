package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fencesandbox/fence/api"
)

// Errors of the secret records. Both wrap an api sentinel.
var (
	// ErrSecretNotFound is returned for an unknown secret.
	ErrSecretNotFound = fmt.Errorf("secret %w", api.ErrNotFound)
	// ErrSecretChanged is returned by UpdateSecret when the record's
	// version is no longer the one the caller read: another update won.
	ErrSecretChanged = fmt.Errorf("secret changed meanwhile: %w", api.ErrConflict)
)

// Secret is one secret record. Sealed is the value as internal/secrets
// sealed it; the store never holds a value.
type Secret struct {
	ID        string
	Name      string
	Version   int64
	Metadata  map[string]string
	Sealed    []byte
	CreatedAt time.Time
	UpdatedAt time.Time
	// Team owns the secret; InsertSecret sets the team of its context
	// when empty. Names are unique within a team.
	Team string
}

// SecretCursor is a position in ListSecrets order (newest first).
type SecretCursor struct {
	CreatedAt time.Time
	ID        string
}

const secretColumns = `id, name, version, metadata, sealed, created_at, updated_at, team`

// InsertSecret adds a secret record unless the store already holds
// capacity of them (0: no cap). A taken name or ID, and a full store, give an error
// wrapping api.ErrConflict. The count and the insert are one statement
// (in PostgreSQL under a lock every node takes), so concurrent inserts
// cannot overshoot capacity.
func (s *Store) InsertSecret(ctx context.Context, sec *Secret, capacity int) error {
	return s.InsertTeamSecret(ctx, sec, capacity, 0)
}

// InsertTeamSecret is InsertSecret that also refuses the secret when its
// team holds teamCapacity secrets already (0: no cap), with an error
// wrapping api.ErrResourceExhausted. Both counts and the insert are one
// statement.
func (s *Store) InsertTeamSecret(ctx context.Context, sec *Secret, capacity, teamCapacity int) error {
	md, err := encodeMetadata(sec.Metadata)
	if err != nil {
		return err
	}
	limit, teamLimit := int64(capacity), int64(teamCapacity)
	if capacity <= 0 {
		limit = -1
	}
	if teamCapacity <= 0 {
		teamLimit = -1
	}
	team := ownerOf(ctx, sec.Team)
	tx, err := s.shared.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("inserting secret: %w", err)
	}
	defer tx.Rollback()
	if err := tx.serialize(ctx, "secrets"); err != nil {
		return fmt.Errorf("inserting secret: %w", err)
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO secrets (`+secretColumns+`)
		SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE (? < 0 OR (SELECT COUNT(*) FROM secrets) < ?)
		AND (? < 0 OR (SELECT COUNT(*) FROM secrets WHERE team = ?) < ?)`,
		sec.ID, sec.Name, sec.Version, md, sec.Sealed, sec.CreatedAt.UnixNano(), sec.UpdatedAt.UnixNano(), team,
		limit, limit, teamLimit, team, teamLimit)
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		if isUniqueViolation(err) {
			return fmt.Errorf("inserting secret: name or ID taken: %w", api.ErrConflict)
		}
		return fmt.Errorf("inserting secret: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("inserting secret: %w", err)
	} else if n == 0 {
		if teamCapacity > 0 {
			if held, err := s.CountTeamSecrets(ctx, team); err == nil && held >= teamCapacity {
				return fmt.Errorf("you have reached the maximum number of secrets (%d): %w", teamCapacity, api.ErrResourceExhausted)
			}
		}
		return fmt.Errorf("inserting secret: the store holds its maximum of %d secrets: %w", capacity, api.ErrConflict)
	}
	return nil
}

// SecretByID returns the record of id, or an error wrapping
// ErrSecretNotFound (also for another team's when ctx acts for a
// principal, as every secret lookup, list, update and delete).
func (s *Store) SecretByID(ctx context.Context, id string) (*Secret, error) {
	return s.secretWhere(ctx, "id", id)
}

// SecretByName returns the record named name, or an error wrapping
// ErrSecretNotFound.
func (s *Store) SecretByName(ctx context.Context, name string) (*Secret, error) {
	return s.secretWhere(ctx, "name", name)
}

func (s *Store) secretWhere(ctx context.Context, col, v string) (*Secret, error) {
	cond, args := scope(ctx, "secrets")
	row := s.shared.QueryRowContext(ctx, `SELECT `+secretColumns+` FROM secrets WHERE `+col+` = ? AND `+cond, append([]any{v}, args...)...)
	sec, err := scanSecret(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("getting secret: %w", ErrSecretNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting secret: %w", err)
	}
	return sec, nil
}

// ListSecrets returns up to limit records (0: all), newest first (created
// desc, then ID desc), strictly after the cursor when it is not nil.
func (s *Store) ListSecrets(ctx context.Context, after *SecretCursor, limit int) ([]*Secret, error) {
	cond, args := scope(ctx, "secrets")
	q := `SELECT ` + secretColumns + ` FROM secrets WHERE ` + cond
	if after != nil {
		n := after.CreatedAt.UnixNano()
		q += ` AND (created_at < ? OR (created_at = ? AND id < ?))`
		args = append(args, n, n, after.ID)
	}
	q += ` ORDER BY created_at DESC, id DESC`
	if limit > 0 {
		q += ` LIMIT ?`
		args = append(args, limit)
	}
	rows, err := s.shared.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing secrets: %w", err)
	}
	defer rows.Close()
	var out []*Secret
	for rows.Next() {
		sec, err := scanSecret(rows)
		if err != nil {
			return nil, fmt.Errorf("listing secrets: %w", err)
		}
		out = append(out, sec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing secrets: %w", err)
	}
	return out, nil
}

// UpdateSecret stores sealed as version from+1 of secret id, if its
// version is still from. A nil metadata keeps the stored one; a non-nil
// one (even empty) replaces it. A missing record gives an error wrapping
// ErrSecretNotFound, a version other than from one wrapping
// ErrSecretChanged.
func (s *Store) UpdateSecret(ctx context.Context, id string, from int64, sealed []byte, metadata map[string]string, at time.Time) error {
	q := `UPDATE secrets SET version = version + 1, sealed = ?, updated_at = ?`
	args := []any{sealed, at.UnixNano()}
	if metadata != nil {
		md, err := encodeMetadata(metadata)
		if err != nil {
			return err
		}
		q += `, metadata = ?`
		args = append(args, md)
	}
	cond, scoped := scope(ctx, "secrets")
	q += ` WHERE id = ? AND version = ? AND ` + cond
	args = append(append(args, id, from), scoped...)
	res, err := s.shared.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("updating secret: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("updating secret: %w", err)
	}
	if n == 1 {
		return nil
	}
	if _, err := s.SecretByID(ctx, id); err != nil {
		return fmt.Errorf("updating secret: %w", err)
	}
	return fmt.Errorf("updating secret: %w", ErrSecretChanged)
}

// DeleteSecret removes a secret record, or returns an error wrapping
// ErrSecretNotFound.
func (s *Store) DeleteSecret(ctx context.Context, id string) error {
	cond, args := scope(ctx, "secrets")
	res, err := s.shared.ExecContext(ctx, `DELETE FROM secrets WHERE id = ? AND `+cond, append([]any{id}, args...)...)
	if err != nil {
		return fmt.Errorf("deleting secret: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("deleting secret: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("deleting secret: %w", ErrSecretNotFound)
	}
	return nil
}

// CountSecrets returns the number of secret records.
func (s *Store) CountSecrets(ctx context.Context) (int, error) {
	var n int
	if err := s.shared.QueryRowContext(ctx, `SELECT COUNT(*) FROM secrets`).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting secrets: %w", err)
	}
	return n, nil
}

func encodeMetadata(md map[string]string) (string, error) {
	if md == nil {
		md = map[string]string{}
	}
	b, err := json.Marshal(md)
	if err != nil {
		return "", fmt.Errorf("encoding metadata: %w", err)
	}
	return string(b), nil
}

func scanSecret(r scanner) (*Secret, error) {
	var (
		sec              Secret
		md               string
		created, updated int64
	)
	if err := r.Scan(&sec.ID, &sec.Name, &sec.Version, &md, &sec.Sealed, &created, &updated, &sec.Team); err != nil {
		return nil, err
	}
	sec.CreatedAt = time.Unix(0, created).UTC()
	sec.UpdatedAt = time.Unix(0, updated).UTC()
	if err := json.Unmarshal([]byte(md), &sec.Metadata); err != nil {
		return nil, fmt.Errorf("decoding metadata of secret %s: %w", sec.ID, err)
	}
	if sec.Metadata == nil {
		sec.Metadata = map[string]string{}
	}
	return &sec, nil
}
