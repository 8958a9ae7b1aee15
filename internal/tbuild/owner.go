package tbuild

import (
	"context"

	"github.com/fencesandbox/fence/internal/tbuild/names"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Built templates belong to the default team: template builds are open
// to it alone (the API answers other teams' build routes 403, and lists
// them no built template). Another team sees a built template only when
// it is public, as E2B's public templates; fence's own templates
// (Options.Parents) are every team's.

// ResolveFor is Resolve for a sandbox create acting for ctx: a built
// template another team may not use answers exactly as an unknown name.
func (c Catalog) ResolveFor(ctx context.Context, name string) (string, error) {
	if tenancy.TeamOf(ctx) != tenancy.DefaultTeamID && c.s.hiddenBuilt(name) {
		return c.s.opts.Parents.Resolve(name)
	}
	return c.Resolve(name)
}

// hiddenBuilt reports whether name is a built template (or a build
// sandbox's layer) that is not public.
func (s *Service) hiddenBuilt(name string) bool {
	s.mu.Lock()
	_, layer := s.layers[name]
	s.mu.Unlock()
	if layer {
		return true
	}
	n, err := names.ParseName(name)
	if err != nil || !s.names.Knows(n) {
		return false
	}
	t, err := s.names.Lookup(name)
	return err != nil || !t.Public
}
