package sandbox

import (
	"context"

	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// owned returns live sandbox id's entry when ctx may see it: a sandbox
// of a team other than the one ctx acts for answers exactly as a missing
// one. Work the daemon does on its own (no principal) sees every team's.
func (m *Manager) owned(ctx context.Context, id string) (*entry, error) {
	e, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	if !tenancy.Visible(ctx, e.team) {
		return nil, notFound(id)
	}
	return e, nil
}

// Owned checks that ctx may see sandbox id, live or killed: it returns
// nil for one of ctx's team the Manager or its store knows of, and the
// error of a missing sandbox (wrapping api.ErrNotFound) for an unknown ID
// and for another team's sandbox alike, so that the two cannot be told
// apart.
func (m *Manager) Owned(ctx context.Context, id string) error {
	if e, err := m.lookup(id); err == nil {
		if !tenancy.Visible(ctx, e.team) {
			return notFound(id)
		}
		return nil
	}
	g, ok := m.store.(recordGetter)
	if !ok {
		return notFound(id)
	}
	if _, err := g.Get(ctx, id); err != nil {
		return notFound(id)
	}
	return nil
}

// recordGetter is the part of the store Owned reads killed sandboxes'
// records with (a store without it knows of live sandboxes alone).
type recordGetter interface {
	Get(ctx context.Context, id string) (*store.Sandbox, error)
}

// ownedLookup is core.lookup for a request acting for ctx: another team's
// sandbox answers exactly as a missing one.
func ownedLookup(ctx context.Context, core pauseCore, id string) (*entry, error) {
	e, err := core.lookup(id)
	if err == nil && !tenancy.Visible(ctx, e.team) {
		return nil, notFound(id)
	}
	return e, err
}

// ResolverFor is implemented by Templates some of whose templates only
// some teams may use: a create resolves its template for the team it
// acts for, another team's template answering as an unknown one.
type ResolverFor interface {
	ResolveFor(ctx context.Context, name string) (rootfs string, err error)
}
