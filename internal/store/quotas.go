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

// migrationTeamEgress keeps the bytes each team's sandboxes moved through
// the egress fence on each UTC day (day: the unix second it starts).
const migrationTeamEgress = `CREATE TABLE team_egress (
	team  TEXT NOT NULL,
	day   INTEGER NOT NULL,
	bytes INTEGER NOT NULL,
	PRIMARY KEY (team, day)
)`

// AddTeamEgress adds bytes to team's egress of day.
func (s *Store) AddTeamEgress(ctx context.Context, team string, day, bytes int64) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO team_egress (team, day, bytes) VALUES (?, ?, ?)
		ON CONFLICT (team, day) DO UPDATE SET bytes = team_egress.bytes + excluded.bytes`, team, day, bytes); err != nil {
		return fmt.Errorf("counting the egress of team %s: %w", team, err)
	}
	return nil
}

// TeamEgress returns every team's egress of day, by team.
func (s *Store) TeamEgress(ctx context.Context, day int64) (map[string]int64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT team, bytes FROM team_egress WHERE day = ?`, day)
	if err != nil {
		return nil, fmt.Errorf("reading the teams' egress: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var team string
		var n int64
		if err := rows.Scan(&team, &n); err != nil {
			return nil, fmt.Errorf("reading the teams' egress: %w", err)
		}
		out[team] = n
	}
	return out, rows.Err()
}

var _ tenancy.EgressStore = (*Store)(nil)

// migrationCredentialRole keeps each credential's role ("" or
// tenancy.RoleAuditor).
const migrationCredentialRole = `ALTER TABLE credentials ADD COLUMN role TEXT NOT NULL DEFAULT ''`
