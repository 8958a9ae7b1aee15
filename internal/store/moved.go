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

// migrationMovedSandboxes keeps the sandboxes a drained node moved to the
// cluster's registry (internal/drainmove): the node that takes one over
// claims its row, and routers find it through any node.
const migrationMovedSandboxes = `CREATE TABLE moved_sandboxes (
		id         TEXT PRIMARY KEY,  -- the sandbox's ID, kept on its new node
		team       TEXT NOT NULL,
		from_node  TEXT NOT NULL,
		node       TEXT NOT NULL,     -- '' until a node takes it over
		backend    TEXT NOT NULL,
		template   TEXT NOT NULL,
		layer      TEXT NOT NULL,
		chain      TEXT NOT NULL,     -- JSON: [{layer, digest}], top first
		record     TEXT NOT NULL,     -- JSON: the sandbox's record, paused
		cold       BLOB NOT NULL,     -- its sealed resume data
		moved_at   INTEGER NOT NULL,  -- unix nanoseconds
		taken_at   INTEGER NOT NULL   -- unix nanoseconds; 0 until taken over
	)`

// Moved is a sandbox moved off its node through the registry.
type Moved struct {
	ID, Team, FromNode string
	// Node took the sandbox over ("" while none has).
	Node              string
	Backend, Template string
	Layer             string
	Chain             []LayerRef
	Record            Sandbox
	Cold              []byte
	MovedAt, TakenAt  time.Time
}

const movedCols = `id, team, from_node, node, backend, template, layer, chain, record, cold, moved_at, taken_at`

func scanMoved(r scanner) (*Moved, error) {
	var mv Moved
	var chain, rec string
	var moved, taken int64
	if err := r.Scan(&mv.ID, &mv.Team, &mv.FromNode, &mv.Node, &mv.Backend, &mv.Template, &mv.Layer, &chain, &rec, &mv.Cold,
		&moved, &taken); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(chain), &mv.Chain); err != nil {
		return nil, fmt.Errorf("moved sandbox %s: reading its layers: %w", mv.ID, err)
	}
	if err := json.Unmarshal([]byte(rec), &mv.Record); err != nil {
		return nil, fmt.Errorf("moved sandbox %s: reading its record: %w", mv.ID, err)
	}
	mv.MovedAt = time.Unix(0, moved).UTC()
	if taken != 0 {
		mv.TakenAt = time.Unix(0, taken).UTC()
	}
	return &mv, nil
}

// PutMoved records a sandbox moved to the registry, not taken over yet. A
// sandbox moved again (taken over, then its node drained in turn)
// replaces its row.
func (s *Store) PutMoved(ctx context.Context, mv *Moved) error {
	chain, err := json.Marshal(mv.Chain)
	if err != nil {
		return err
	}
	rec, err := json.Marshal(mv.Record)
	if err != nil {
		return err
	}
	mv.Team = ownerOf(ctx, mv.Team)
	if _, err := s.shared.ExecContext(ctx, `INSERT INTO moved_sandboxes (`+movedCols+`) VALUES (?,?,?,'',?,?,?,?,?,?,?,0)
		ON CONFLICT (id) DO UPDATE SET team = excluded.team, from_node = excluded.from_node, node = '', backend = excluded.backend,
			template = excluded.template, layer = excluded.layer, chain = excluded.chain, record = excluded.record,
			cold = excluded.cold, moved_at = excluded.moved_at, taken_at = 0`,
		mv.ID, mv.Team, mv.FromNode, mv.Backend, mv.Template, mv.Layer, string(chain), string(rec), mv.Cold,
		mv.MovedAt.UnixNano()); err != nil {
		return fmt.Errorf("recording moved sandbox %s: %w", mv.ID, err)
	}
	return nil
}

// FindMoved returns moved sandbox id, or an error wrapping
// api.ErrNotFound (also for another team's when ctx acts for a
// principal).
func (s *Store) FindMoved(ctx context.Context, id string) (*Moved, error) {
	cond, args := scope(ctx, "moved_sandboxes")
	mv, err := scanMoved(s.shared.QueryRowContext(ctx, `SELECT `+movedCols+` FROM moved_sandboxes WHERE id = ? AND `+cond,
		append([]any{id}, args...)...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("moved sandbox %s: %w", id, api.ErrNotFound)
	}
	return mv, err
}

// TakeMoved claims moved sandbox id for node: one node wins, the others
// get an error wrapping api.ErrConflict (api.ErrNotFound when no such
// sandbox was moved).
func (s *Store) TakeMoved(ctx context.Context, id, node string, at time.Time) (*Moved, error) {
	cond, args := scope(ctx, "moved_sandboxes")
	res, err := s.shared.ExecContext(ctx, `UPDATE moved_sandboxes SET node = ?, taken_at = ? WHERE id = ? AND node = '' AND `+cond,
		append([]any{node, at.UnixNano(), id}, args...)...)
	if err := checkAffected(res, err, "taking over moved sandbox "+id, api.ErrConflict); err != nil {
		if _, ferr := s.FindMoved(ctx, id); errors.Is(ferr, api.ErrNotFound) {
			return nil, ferr
		}
		return nil, err
	}
	return s.FindMoved(ctx, id)
}

// ReturnMoved undoes node's TakeMoved of id (its take-over failed): the
// sandbox waits in the registry again.
func (s *Store) ReturnMoved(ctx context.Context, id, node string) error {
	res, err := s.shared.ExecContext(ctx, `UPDATE moved_sandboxes SET node = '', taken_at = 0 WHERE id = ? AND node = ?`, id, node)
	return checkAffected(res, err, "returning moved sandbox "+id, api.ErrNotFound)
}
