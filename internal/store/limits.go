package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fencesandbox/fence/internal/tenancy"
)

// migrationTeamLimits keeps the teams' own limits (tenancy.Limits as a
// JSON document); a team without a row has the daemon-wide defaults.
const migrationTeamLimits = `CREATE TABLE team_limits (
	team       TEXT PRIMARY KEY,
	doc        TEXT NOT NULL,
	updated_at INTEGER NOT NULL
)`

// TeamLimits returns every team's own limits, by team ID.
func (s *Store) TeamLimits(ctx context.Context) (map[string]tenancy.Limits, error) {
	rows, err := s.shared.QueryContext(ctx, `SELECT team, doc FROM team_limits`)
	if err != nil {
		return nil, fmt.Errorf("listing team limits: %w", err)
	}
	defer rows.Close()
	out := map[string]tenancy.Limits{}
	for rows.Next() {
		var team, doc string
		if err := rows.Scan(&team, &doc); err != nil {
			return nil, fmt.Errorf("reading team limits: %w", err)
		}
		var l tenancy.Limits
		if err := json.Unmarshal([]byte(doc), &l); err != nil {
			return nil, fmt.Errorf("decoding the limits of team %s: %w", team, err)
		}
		out[team] = l
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing team limits: %w", err)
	}
	return out, nil
}

// SetTeamLimits makes l team's own limits.
func (s *Store) SetTeamLimits(ctx context.Context, team string, l tenancy.Limits) error {
	doc, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if _, err := s.shared.ExecContext(ctx, `INSERT INTO team_limits (team, doc, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (team) DO UPDATE SET doc = excluded.doc, updated_at = excluded.updated_at`,
		team, string(doc), time.Now().UnixNano()); err != nil {
		return fmt.Errorf("setting the limits of team %s: %w", team, err)
	}
	return nil
}

var _ tenancy.LimitsStore = (*Store)(nil)
