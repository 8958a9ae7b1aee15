package tbuild

import (
	"context"

	"github.com/fencesandbox/fence/internal/tenancy"
)

// A built template belongs to the team that registered it (the default
// team's for records made before teams). Another team may make sandboxes
// of it only when it is public, as E2B's public templates; everything
// else of it (its builds, tags, logs, visibility, deletion) is its team's
// alone. fence's own templates (Options.Parents) are every team's, and a
// build sandbox's layer (a name no request can give) its build's.

// ResolveFor is Resolve for a sandbox create acting for ctx: a built
// template another team may not use answers exactly as an unknown name.
func (c Catalog) ResolveFor(ctx context.Context, name string) (string, error) {
	if c.s.hiddenFor(ctx, name) {
		return c.s.opts.Parents.Resolve(name)
	}
	return c.Resolve(name)
}

// hiddenFor reports whether name is a built template of another team than
// ctx's that is not public.
func (s *Service) hiddenFor(ctx context.Context, name string) bool {
	team, public, found := s.Owner(name)
	return found && !public && team != tenancy.TeamOf(ctx)
}

// Owner returns the team of the built template idOrName names (by ID, or
// by name with or without a tag) and whether it is public; fence's own
// templates are every team's ("" and public). found is false when it
// names none.
func (s *Service) Owner(idOrName string) (team string, public, found bool) {
	t, err := s.names.Lookup(idOrName)
	if err != nil {
		if _, err := s.opts.Parents.Resolve(idOrName); err == nil {
			return "", true, true
		}
		ctx, cancel := indexCtx()
		defer cancel()
		if rec, err := s.indexed(ctx, idOrName); err == nil && rec != nil {
			return rec.Team, rec.Public, true
		}
		return "", false, false
	}
	return tenancy.Owner(t.Team), t.Public, true
}
