package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/fencesandbox/fence/internal/tenancy"
)

// migrationQuotaReservations keeps what each sandbox takes of its team's
// quota, for nodes sharing one database to hold the team's limits
// together. A reservation carries the node that made it and an expiry the
// node pushes forward while it lives (RenewReservations): a crashed
// node's reservations expire and stop counting.
const migrationQuotaReservations = `CREATE TABLE quota_reservations (
	id         TEXT PRIMARY KEY, -- the sandbox's ID (a create's own until it has one)
	team       TEXT NOT NULL,
	node       TEXT NOT NULL,
	paused     INTEGER NOT NULL DEFAULT 0,
	cpu_milli  INTEGER NOT NULL, -- vCPUs x 1000
	memory_mb  INTEGER NOT NULL,
	expires_at INTEGER NOT NULL  -- unix nanoseconds
);
CREATE INDEX quota_reservations_team ON quota_reservations (team, expires_at);
CREATE INDEX quota_reservations_node ON quota_reservations (node)`

// reservationUsage sums a team's reservations as a tenancy.Usage (and
// vCPUs in thousandths); PostgreSQL's SUM of a BIGINT is a NUMERIC,
// hence the casts.
const reservationUsage = `SELECT
	CAST(COALESCE(SUM(CASE WHEN paused = 0 THEN 1 ELSE 0 END), 0) AS BIGINT),
	CAST(COALESCE(SUM(CASE WHEN paused = 0 THEN 0 ELSE 1 END), 0) AS BIGINT),
	CAST(COALESCE(SUM(CASE WHEN paused = 0 THEN cpu_milli ELSE 0 END), 0) AS BIGINT),
	CAST(COALESCE(SUM(CASE WHEN paused = 0 THEN memory_mb ELSE 0 END), 0) AS BIGINT)
	FROM quota_reservations WHERE team = ?`

// Reservation is what one sandbox takes of its team's quota, reserved by
// a node.
type Reservation struct {
	ID       string
	Team     string
	Node     string
	CPUs     float64
	MemoryMB int64
	Paused   bool
	// Expires is when the reservation stops counting unless its node
	// renews it.
	Expires time.Time
}

// Reserve records r, unless one more running sandbox of its size is over
// one of its team's limits: the team's own (SetTeamLimits), else
// defaults. The team's live reservations are counted and r inserted in
// one transaction, one team's at a time across every node sharing the
// database, so concurrent creates on any nodes never overshoot a limit.
// Expired reservations are dropped first. A refusal is
// tenancy.CheckSize's or tenancy.CheckRun's error.
func (s *Store) Reserve(ctx context.Context, r Reservation, defaults tenancy.Limits) error {
	return s.reservation(ctx, r.Team, defaults, func(tx *engineTx, l tenancy.Limits, u tenancy.Usage) error {
		size := tenancy.Size{CPUs: r.CPUs, MemoryMB: r.MemoryMB}
		if err := tenancy.CheckSize(l, size); err != nil {
			return err
		}
		if err := tenancy.CheckRun(l, u, size); err != nil {
			return err
		}
		return insertReservation(ctx, tx, r)
	})
}

// ForceReservation records r whatever the limits (a sandbox that exists
// already: one a restarted node takes over), replacing one of its ID.
func (s *Store) ForceReservation(ctx context.Context, r Reservation) error {
	return insertReservation(ctx, s.shared, r)
}

func insertReservation(ctx context.Context, q queryer, r Reservation) error {
	_, err := q.ExecContext(ctx, `INSERT INTO quota_reservations (id, team, node, paused, cpu_milli, memory_mb, expires_at)
		VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET team = excluded.team, node = excluded.node,
		paused = excluded.paused, cpu_milli = excluded.cpu_milli, memory_mb = excluded.memory_mb, expires_at = excluded.expires_at`,
		r.ID, r.Team, r.Node, r.Paused, int64(math.Round(r.CPUs*1000)), r.MemoryMB, r.Expires.UnixNano())
	if err != nil {
		return fmt.Errorf("reserving quota for %s: %w", r.ID, err)
	}
	return nil
}

// MoveReservation moves reservation id to paused (or back to running),
// refused at the team's paused limit (or its running limits) counted over
// every node, as Reserve counts. A missing reservation, or one already
// there, changes nothing.
func (s *Store) MoveReservation(ctx context.Context, id string, paused bool, defaults tenancy.Limits) error {
	var r Reservation
	var cpuMilli int64
	var p int
	err := s.shared.QueryRowContext(ctx, `SELECT team, paused, cpu_milli, memory_mb FROM quota_reservations WHERE id = ?`, id).
		Scan(&r.Team, &p, &cpuMilli, &r.MemoryMB)
	if errors.Is(err, sql.ErrNoRows) || err == nil && (p != 0) == paused {
		return nil
	}
	if err != nil {
		return fmt.Errorf("moving the quota of %s: %w", id, err)
	}
	return s.reservation(ctx, r.Team, defaults, func(tx *engineTx, l tenancy.Limits, u tenancy.Usage) error {
		if paused {
			if err := tenancy.CheckPause(l, u); err != nil {
				return err
			}
		} else if err := tenancy.CheckRun(l, u, tenancy.Size{CPUs: float64(cpuMilli) / 1000, MemoryMB: r.MemoryMB}); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE quota_reservations SET paused = ? WHERE id = ?`, paused, id); err != nil {
			return fmt.Errorf("moving the quota of %s: %w", id, err)
		}
		return nil
	})
}

// SetReservationPaused moves reservation id to paused or running
// whatever the limits (the undoing of a MoveReservation whose pause or
// resume failed).
func (s *Store) SetReservationPaused(ctx context.Context, id string, paused bool) error {
	if _, err := s.shared.ExecContext(ctx, `UPDATE quota_reservations SET paused = ? WHERE id = ?`, paused, id); err != nil {
		return fmt.Errorf("moving the quota of %s: %w", id, err)
	}
	return nil
}

// reservation runs check in a transaction holding team's reservation
// lock, with the team's limits and live reservations' usage.
func (s *Store) reservation(ctx context.Context, team string, defaults tenancy.Limits,
	check func(tx *engineTx, l tenancy.Limits, u tenancy.Usage) error) error {
	tx, err := s.shared.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("reserving quota: %w", err)
	}
	defer tx.Rollback()
	if err := tx.serialize(ctx, "quota:"+team); err != nil {
		return fmt.Errorf("reserving quota: %w", err)
	}
	// A write first: SQLite takes its write lock here (waiting its busy
	// timeout), not at the insert after the reads.
	if _, err := tx.ExecContext(ctx, `DELETE FROM quota_reservations WHERE team = ? AND expires_at < ?`,
		team, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("dropping expired reservations: %w", err)
	}
	l := defaults
	var doc string
	switch err := tx.QueryRowContext(ctx, `SELECT doc FROM team_limits WHERE team = ?`, team).Scan(&doc); {
	case err == nil:
		if err := json.Unmarshal([]byte(doc), &l); err != nil {
			return fmt.Errorf("decoding the limits of team %s: %w", team, err)
		}
	case !errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("reading the limits of team %s: %w", team, err)
	}
	var (
		u        tenancy.Usage
		cpuMilli int64
	)
	if err := tx.QueryRowContext(ctx, reservationUsage, team).Scan(&u.Running, &u.Paused, &cpuMilli, &u.MemoryMB); err != nil {
		return fmt.Errorf("counting reservations of team %s: %w", team, err)
	}
	u.CPUs = float64(cpuMilli) / 1000
	if err := check(tx, l, u); err != nil {
		return err
	}
	return tx.Commit()
}

// RenameReservation gives reservation from the ID to (a create's
// reservation its sandbox's ID).
func (s *Store) RenameReservation(ctx context.Context, from, to string) error {
	res, err := s.shared.ExecContext(ctx, `UPDATE quota_reservations SET id = ? WHERE id = ?`, to, from)
	return checkOne(res, err, "renaming reservation "+from)
}

// ReleaseReservation drops reservation id. A missing one is no error.
func (s *Store) ReleaseReservation(ctx context.Context, id string) error {
	if _, err := s.shared.ExecContext(ctx, `DELETE FROM quota_reservations WHERE id = ?`, id); err != nil {
		return fmt.Errorf("releasing reservation %s: %w", id, err)
	}
	return nil
}

// RenewReservations pushes the expiry of node's reservations to until
// and returns how many it renewed.
func (s *Store) RenewReservations(ctx context.Context, node string, until time.Time) (int64, error) {
	res, err := s.shared.ExecContext(ctx, `UPDATE quota_reservations SET expires_at = ? WHERE node = ?`, until.UnixNano(), node)
	if err != nil {
		return 0, fmt.Errorf("renewing the reservations of node %s: %w", node, err)
	}
	return res.RowsAffected()
}

// NodeReservations returns the IDs of node's reservations.
func (s *Store) NodeReservations(ctx context.Context, node string) ([]string, error) {
	rows, err := s.shared.QueryContext(ctx, `SELECT id FROM quota_reservations WHERE node = ?`, node)
	if err != nil {
		return nil, fmt.Errorf("listing the reservations of node %s: %w", node, err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("listing the reservations of node %s: %w", node, err)
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// DropNodeReservations drops every reservation of node (a node starting
// again counts its sandboxes anew).
func (s *Store) DropNodeReservations(ctx context.Context, node string) error {
	if _, err := s.shared.ExecContext(ctx, `DELETE FROM quota_reservations WHERE node = ?`, node); err != nil {
		return fmt.Errorf("dropping the reservations of node %s: %w", node, err)
	}
	return nil
}

// TeamReservations returns what team's live reservations take, over every
// node.
func (s *Store) TeamReservations(ctx context.Context, team string) (tenancy.Usage, error) {
	var (
		u        tenancy.Usage
		cpuMilli int64
	)
	err := s.shared.QueryRowContext(ctx, reservationUsage+` AND expires_at >= ?`, team, time.Now().UnixNano()).
		Scan(&u.Running, &u.Paused, &cpuMilli, &u.MemoryMB)
	if err != nil {
		return u, fmt.Errorf("counting reservations of team %s: %w", team, err)
	}
	u.CPUs = float64(cpuMilli) / 1000
	return u, nil
}
