package tenancy

import "context"

// TeamOf returns the team ctx acts for: its principal's, or DefaultTeamID
// when it acts for none (the daemon on its own). It names the owner of
// what a request creates.
func TeamOf(ctx context.Context) string {
	if p, ok := FromContext(ctx); ok {
		return p.Team
	}
	return DefaultTeamID
}

// Owner returns the team of a stored object: owner, or DefaultTeamID for
// a record made before teams existed (empty owner).
func Owner(owner string) string {
	if owner == "" {
		return DefaultTeamID
	}
	return owner
}

// Visible reports whether an object of team owner exists for ctx: always
// when ctx acts for no principal (the daemon's own work, which names the
// object's team itself), else only when the object is the principal's
// team's. Callers answer an invisible object exactly as a missing one.
func Visible(ctx context.Context, owner string) bool {
	p, ok := FromContext(ctx)
	return !ok || p.Team == Owner(owner)
}

// Scope returns the team a list or lookup is confined to for ctx: the
// principal's, or "" (every team) when ctx acts for no principal.
func Scope(ctx context.Context) string {
	if p, ok := FromContext(ctx); ok {
		return p.Team
	}
	return ""
}
