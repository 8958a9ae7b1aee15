package store

import (
	"context"
	"fmt"
	"time"

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
	if err := s.shared.QueryRowContext(ctx, `SELECT COUNT(*) FROM secrets WHERE team = ?`, team).Scan(&n); err != nil {
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
	if _, err := s.shared.ExecContext(ctx, `INSERT INTO team_egress (team, day, bytes) VALUES (?, ?, ?)
		ON CONFLICT (team, day) DO UPDATE SET bytes = team_egress.bytes + excluded.bytes`, team, day, bytes); err != nil {
		return fmt.Errorf("counting the egress of team %s: %w", team, err)
	}
	return nil
}

// TeamEgress returns every team's egress of day, by team.
func (s *Store) TeamEgress(ctx context.Context, day int64) (map[string]int64, error) {
	rows, err := s.shared.QueryContext(ctx, `SELECT team, bytes FROM team_egress WHERE day = ?`, day)
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

// migrationTeamNames keeps the names approved for whole teams (the
// "team" decision on an egress approval request), and who decided.
const migrationTeamNames = `CREATE TABLE team_allowed_names (
	team       TEXT NOT NULL,
	name       TEXT NOT NULL,
	decided_by TEXT NOT NULL,
	decided_at INTEGER NOT NULL,
	PRIMARY KEY (team, name)
)`

// AddTeamName records name as approved for team by decidedBy (a name
// approved again keeps its first record).
func (s *Store) AddTeamName(ctx context.Context, team, name, decidedBy string) error {
	if _, err := s.shared.ExecContext(ctx, `INSERT INTO team_allowed_names (team, name, decided_by, decided_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (team, name) DO NOTHING`, team, name, decidedBy, time.Now().Unix()); err != nil {
		return fmt.Errorf("approving %q for team %s: %w", name, team, err)
	}
	return nil
}

// TeamNames returns the names approved for each team.
func (s *Store) TeamNames(ctx context.Context) (map[string][]string, error) {
	rows, err := s.shared.QueryContext(ctx, `SELECT team, name FROM team_allowed_names ORDER BY team, name`)
	if err != nil {
		return nil, fmt.Errorf("reading the names approved for teams: %w", err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var team, name string
		if err := rows.Scan(&team, &name); err != nil {
			return nil, fmt.Errorf("reading the names approved for teams: %w", err)
		}
		out[team] = append(out[team], name)
	}
	return out, rows.Err()
}
