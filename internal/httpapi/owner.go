package httpapi

import (
	"context"
	"net/http"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/sandbox/usage"
	"github.com/fencesandbox/fence/internal/tbuild"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// templateInPath is the template a template route names in its path
// ("" for none).
func templateInPath(r *http.Request) string {
	if a, b := r.PathValue("a"), r.PathValue("b"); a == "aliases" {
		return b
	} else if a != "" {
		return a
	}
	return r.PathValue("id")
}

// ownTemplate checks that name (if any) names a template of the
// request's team or one of fence's own (every team's): an unknown name
// and another team's built template get the same 404, whatever the route
// would do with it.
func (h *handler) ownTemplate(r *http.Request, name string) error {
	if name == "" {
		return nil
	}
	if team, _, found := h.templates.Owner(name); !found || (team != "" && team != tenancy.TeamOf(r.Context())) {
		return errorf(api.ErrNotFound, "template %q not found", name)
	}
	return nil
}

// ownTemplates is the part of a template list that is the request's
// team's.
func ownTemplates(r *http.Request, all []tbuild.Listed) []tbuild.Listed {
	team := tenancy.TeamOf(r.Context())
	out := make([]tbuild.Listed, 0, len(all))
	for _, l := range all {
		if l.Team == team {
			out = append(out, l)
		}
	}
	return out
}

// ownUsage confines a usage report to what ctx's principal may read (the
// bootstrap principal reads it all): the rows of its team's sandboxes
// (made by its team's keys, or else owned by its team) and the totals of
// its team's keys. Another team's sandbox is left out exactly as a
// missing one is.
func (h *handler) ownUsage(ctx context.Context, rep *usage.Report) *usage.Report {
	p, ok := tenancy.FromContext(ctx)
	if !ok || (p.Admin && p.Team == tenancy.DefaultTeamID) {
		return rep
	}
	out := &usage.Report{Sandboxes: []usage.Usage{}, Keys: []usage.KeyUsage{}}
	for _, u := range rep.Sandboxes {
		team, named := actorTeam(u.Actor)
		if (named && team == p.Team) || (!named && h.m.Owned(ctx, u.SandboxID) == nil) {
			out.Sandboxes = append(out.Sandboxes, u)
		}
	}
	for _, k := range rep.Keys {
		if team, ok := actorTeam(k.Actor); ok && team == p.Team {
			out.Keys = append(out.Keys, k)
		}
	}
	return out
}

// auditVisible returns what selects the audit records ctx's principal may
// read, or nil for the bootstrap principal, which reads every record: a
// record a team's request caused (its actor "team:<id> key:<key id>") is
// that team's; one the daemon or a sandbox caused is the team's of its
// sandbox; the rest (the daemon's own, records from before teams without
// a sandbox the team owns) are the bootstrap principal's alone. It asks
// the sandboxes' owners once per sandbox and is for one goroutine.
func (h *handler) auditVisible(ctx context.Context) func(*audit.Record) bool {
	p, ok := tenancy.FromContext(ctx)
	if !ok || (p.Admin && p.Team == tenancy.DefaultTeamID) {
		return nil
	}
	owned := map[string]bool{}
	return func(r *audit.Record) bool {
		if team, ok := actorTeam(r.Actor); ok {
			return team == p.Team
		}
		if r.Sandbox == "" {
			return false
		}
		v, seen := owned[r.Sandbox]
		if !seen {
			v = h.m.Owned(ctx, r.Sandbox) == nil
			owned[r.Sandbox] = v
		}
		return v
	}
}

// actorTeam returns the team of an audit actor "team:<id> key:<key id>".
func actorTeam(actor string) (string, bool) {
	rest, ok := strings.CutPrefix(actor, "team:")
	if !ok {
		return "", false
	}
	team, _, _ := strings.Cut(rest, " ")
	return team, true
}

// both is a record selector accepting what a and b (nil: everything) do.
func both(a, b func(*audit.Record) bool) func(*audit.Record) bool {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return func(r *audit.Record) bool { return a(r) && b(r) }
}

// namesSandbox reports whether a control-plane route names a sandbox in
// its path.
func namesSandbox(pattern string) bool {
	return strings.Contains(pattern, "/sandboxes/{id}")
}

// checkOwner is THE ownership gate of the routes naming a sandbox in
// their path: it passes a sandbox of the request's team (live or killed),
// and answers an unknown ID and another team's sandbox with the same
// error, so that no route, whatever it does with a sandbox (its logs,
// downloads, export, metrics, snapshots, checkpoints), tells another
// team's sandbox from a missing one.
func (h *handler) checkOwner(r *http.Request, pattern string) error {
	if !namesSandbox(pattern) {
		return nil
	}
	id := pathSegment(pattern, r.URL.Path, "{id}")
	if !api.ValidSandboxID(id) {
		return errorf(api.ErrNotFound, "sandbox %q not found", id)
	}
	if h.m == nil {
		// A handler without sandboxes (secrets and records only): the
		// bootstrap principal, which sees every team's, reads what its
		// records hold; no team's key does.
		if p, ok := tenancy.FromContext(r.Context()); ok && p.Admin && p.Team == tenancy.DefaultTeamID {
			return nil
		}
		return errorf(api.ErrNotFound, "sandbox %q not found", id)
	}
	err := h.m.Owned(r.Context(), id)
	if err != nil && (h.knownFromRecords(r, id) || h.movedHere(r, pattern, id)) {
		return nil
	}
	return err
}

// knownFromRecords reports whether the audit log alone still knows
// sandbox id (its record pruned long after its kill), for the bootstrap
// principal only: such records name no team, so no team's key sees them.
func (h *handler) knownFromRecords(r *http.Request, id string) bool {
	p, ok := tenancy.FromContext(r.Context())
	if !ok || !p.Admin || p.Team != tenancy.DefaultTeamID || h.audit == nil {
		return false
	}
	recs, err := h.audit.Query(r.Context(), audit.Filter{Sandbox: id, Limit: 1})
	return err == nil && len(recs) > 0
}

// pathSegment returns the segment of path at the place of wildcard in
// the route pattern ("METHOD /a/{w}/b"): the mux sets path values only
// once it serves the request, after the gate.
func pathSegment(pattern, path, wildcard string) string {
	if _, p, ok := strings.Cut(pattern, " "); ok {
		pattern = p
	}
	want := strings.Split(pattern, "/")
	got := strings.Split(path, "/")
	for i, seg := range want {
		if seg == wildcard && i < len(got) {
			return got[i]
		}
	}
	return ""
}
