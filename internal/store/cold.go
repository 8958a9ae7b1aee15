package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// migrationCold adds what the resume of a filesystem-only pause needs: a
// paused sandbox without processes boots anew on its kept filesystem, with
// its configuration, also after a restart of the daemon.
const migrationCold = `ALTER TABLE sandboxes ADD COLUMN cold BLOB; -- sealed by the caller, NULL but in a filesystem-only pause`

// PauseCold moves a record from state from to paused, as Transition, and
// keeps data for its resume (ColdResume) until the next transition or its
// kill. data is stored as given: the caller seals what must not be
// stored in plaintext.
func (s *Store) PauseCold(ctx context.Context, id string, from State, startedAt, endAt time.Time, data []byte) error {
	if data == nil {
		data = []byte{}
	}
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET state = 'paused', created_at = ?, end_at = ?, cold = ? WHERE id = ? AND state = ?`,
		startedAt.UnixNano(), endAt.UnixNano(), data, id, string(from))
	return checkOne(res, err, fmt.Sprintf("moving sandbox %s from %s to paused", id, from))
}

// ColdResume returns the data PauseCold kept for a paused record; nil
// when it is not in a filesystem-only pause. An unknown ID is an error
// wrapping ErrNotFound.
func (s *Store) ColdResume(ctx context.Context, id string) ([]byte, error) {
	var data []byte
	err := s.db.QueryRowContext(ctx, `SELECT cold FROM sandboxes WHERE id = ? AND state = 'paused'`, id).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("sandbox %s is not paused: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the resume of sandbox %s: %w", id, err)
	}
	return data, nil
}
