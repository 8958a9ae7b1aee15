package snapreg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Moves of sandboxes off a drained node (fence serve --drain-moves).
//
// MoveOut pauses a sandbox without its memory (sandbox.Pauses.Depart),
// pushes the pause's layers to the registry as a snapshot's are, records
// the sandbox in the shared table moved_sandboxes (its record and its
// sealed resume data) and only then forgets it on its node. MoveIn, on
// the node a later connect or resume of that ID reaches, claims the row
// (one node wins), pulls the layers (verified by digest), and takes the
// sandbox over, paused, under the same ID (sandbox.Pauses.Arrive); the
// connect or resume then boots it there. A failed take-over gives the row
// back, so that another attempt (on any node) can take it. Locate tells
// which node took a moved sandbox over, for the routers.

// Travellers are the sandbox manager's side of a move; *sandbox.Pauses
// implements it.
type Travellers interface {
	Depart(ctx context.Context, id string) (*sandbox.Departure, error)
	Gone(ctx context.Context, id string) error
	Arrive(ctx context.Context, d *sandbox.Departure) error
}

var _ Travellers = (*sandbox.Pauses)(nil)

// MoveOut moves sandbox id off this node into the registry. On an error
// before the shared record is written the sandbox stays here (paused
// without memory if the pause was made).
func (s *Store) MoveOut(ctx context.Context, t Travellers, id string) error {
	d, err := t.Depart(ctx, id)
	if err != nil {
		return err
	}
	backend, chain, err := s.push(ctx, d.Layer)
	if err != nil {
		return fmt.Errorf("moving sandbox %s: %w", id, err)
	}
	mv := &store.Moved{ID: id, Team: d.Record.Team, FromNode: s.node, Backend: backend, Template: d.Template,
		Layer: d.Layer, Chain: chain, Record: d.Record, Cold: d.Cold, MovedAt: time.Now().UTC()}
	if err := s.Store.PutMoved(context.WithoutCancel(ctx), mv); err != nil {
		return fmt.Errorf("moving sandbox %s: %w", id, err)
	}
	if err := t.Gone(context.WithoutCancel(ctx), id); err != nil {
		s.log.WarnContext(ctx, "forgetting a sandbox moved to the registry", "sandbox_id", id, "err", err)
	}
	s.log.InfoContext(ctx, "sandbox moved to the registry", "sandbox_id", id, "layers", len(chain), "digest", chain[0].Digest)
	return nil
}

// MoveIn takes sandbox id over from the registry if it was moved there
// and no node has taken it yet; it reports whether it did. An ID never
// moved (or another team's, when ctx acts for a principal) gives false
// and no error.
func (s *Store) MoveIn(ctx context.Context, t Travellers, id string) (bool, error) {
	if !api.ValidSandboxID(id) {
		return false, nil
	}
	mv, err := s.Store.TakeMoved(ctx, id, s.node, time.Now().UTC())
	if errors.Is(err, api.ErrNotFound) || errors.Is(err, api.ErrConflict) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	giveBack := func(err error) (bool, error) {
		if rerr := s.Store.ReturnMoved(context.WithoutCancel(ctx), id, s.node); rerr != nil {
			s.log.ErrorContext(ctx, "giving back a moved sandbox whose take-over failed", "sandbox_id", id, "err", rerr)
		}
		return false, fmt.Errorf("taking over sandbox %s moved from node %s: %w", id, mv.FromNode, err)
	}
	if err := s.fetch(ctx, mv.Chain, mv.Template); err != nil {
		return giveBack(err)
	}
	rec := mv.Record
	rec.Team = mv.Team
	if err := t.Arrive(ctx, &sandbox.Departure{Record: rec, Cold: mv.Cold, Layer: mv.Layer, Template: mv.Template}); err != nil {
		return giveBack(err)
	}
	s.log.InfoContext(ctx, "sandbox moved here from the registry", "sandbox_id", id, "from_node", mv.FromNode)
	return true, nil
}

// Locate returns the node that took moved sandbox id over ("" while it
// waits in the registry), or an error wrapping api.ErrNotFound for an ID
// never moved (or another team's).
func (s *Store) Locate(ctx context.Context, id string) (string, error) {
	mv, err := s.Store.FindMoved(ctx, id)
	if err != nil {
		return "", err
	}
	return mv.Node, nil
}

// Drain moves every sandbox of this node that can move (list gives their
// IDs) into the registry, one at a time, and returns how many moved. A
// sandbox that cannot move (paused with its memory, mounting volumes) is
// left as it is and logged.
func (s *Store) Drain(ctx context.Context, t Travellers, ids []string) int {
	ctx = tenancy.NewContext(ctx, tenancy.Principal{})
	moved := 0
	for _, id := range ids {
		if ctx.Err() != nil {
			break
		}
		if err := s.MoveOut(ctx, t, id); err != nil {
			s.log.WarnContext(ctx, "a sandbox of the drained node stays", "sandbox_id", id, "err", err)
			continue
		}
		moved++
	}
	return moved
}

// Arriving wraps a node's pauses so that the resume or connect of a
// sandbox this node does not have takes it over from the registry first
// if it was moved there.
type Arriving struct {
	*sandbox.Pauses
	Moves *Store
}

// Resume is sandbox.Pauses.Resume, after a MoveIn of an unknown ID.
func (a Arriving) Resume(ctx context.Context, id string, d time.Duration, autoPause *bool, mem sandbox.Memory) (*sandbox.Sandbox, error) {
	s, err := a.Pauses.Resume(ctx, id, d, autoPause, mem)
	if errors.Is(err, api.ErrNotFound) {
		if ok, merr := a.Moves.MoveIn(ctx, a.Pauses, id); merr != nil {
			return nil, merr
		} else if ok {
			return a.Pauses.Resume(ctx, id, d, autoPause, mem)
		}
	}
	return s, err
}

// Connect is sandbox.Pauses.Connect, after a MoveIn of an unknown ID.
func (a Arriving) Connect(ctx context.Context, id string, d time.Duration, mem sandbox.Memory) (*sandbox.Sandbox, bool, error) {
	s, resumed, err := a.Pauses.Connect(ctx, id, d, mem)
	if errors.Is(err, api.ErrNotFound) {
		if ok, merr := a.Moves.MoveIn(ctx, a.Pauses, id); merr != nil {
			return nil, false, merr
		} else if ok {
			return a.Pauses.Connect(ctx, id, d, mem)
		}
	}
	return s, resumed, err
}
