// Package tenancy names who a request acts for: a team, and the API key
// or access token it came with. Every object fence keeps (sandboxes,
// snapshots, checkpoints, templates, builds, secrets, audit records,
// usage) belongs to one team, and a request sees and changes only its
// own team's objects; another team's answer exactly as missing ones do.
//
// The HTTP layer puts the Principal of every authenticated request in its
// context (NewContext); the parts below read it with FromContext. Work the
// daemon does on its own (the reaper, warm pools, restarts) acts for no
// principal and names the team of the object it works on.
package tenancy

import "context"

// DefaultTeamID is the team fence's bootstrap key (FENCE_API_KEY) belongs
// to, and the owner of everything made before teams existed: a deployment
// with one key keeps working as it did.
const DefaultTeamID = "00000000-0000-4000-8000-000000000001"

// Principal is who a request acts for.
type Principal struct {
	// Team is the ID of the team whose objects the request may see.
	Team string
	// KeyID is the ID of the API key or access token the request
	// authenticated with (never the key itself); BootstrapKeyID for
	// FENCE_API_KEY.
	KeyID string
	// Admin is set for the bootstrap key: it may use the admin routes
	// (teams, every team's keys), besides its own team's objects.
	Admin bool
	// Auditor is set for a key of role RoleAuditor: it may read its
	// team's audit trail, usage, metrics and lists, and change nothing.
	Auditor bool
}

// RoleAuditor is the role of an API key that reads its team's audit
// trail, usage, metrics and lists and may change nothing.
const RoleAuditor = "auditor"

// BootstrapKeyID is the KeyID of FENCE_API_KEY.
const BootstrapKeyID = "bootstrap"

type ctxKey struct{}

// NewContext returns ctx acting for p.
func NewContext(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// FromContext returns the principal ctx acts for, if any.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(ctxKey{}).(Principal)
	return p, ok && p.Team != ""
}
