package store

import (
	"context"
	"fmt"

	"github.com/fencesandbox/fence/internal/tenancy"
)

// migrationSnapshotBytes keeps each snapshot's bytes (Snapshot.Bytes);
// older snapshots count for none.
const migrationSnapshotBytes = `ALTER TABLE snapshots ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0`

// SnapshotUsage returns how many snapshots team keeps and their bytes,
// leaving out the one named except ("": none), which a new snapshot of
// that name replaces.
func (s *Store) SnapshotUsage(ctx context.Context, team, except string) (tenancy.Kept, error) {
	var k tenancy.Kept
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM snapshots
		WHERE team = ? AND (? = '' OR name IS NULL OR name <> ?)`, team, except, except).Scan(&k.Count, &k.Bytes); err != nil {
		return k, fmt.Errorf("counting the snapshots of team %s: %w", team, err)
	}
	return k, nil
}

// CountTeamSecrets returns the number of team's secrets.
func (s *Store) CountTeamSecrets(ctx context.Context, team string) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM secrets WHERE team = ?`, team).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the secrets of team %s: %w", team, err)
	}
	return n, nil
}
