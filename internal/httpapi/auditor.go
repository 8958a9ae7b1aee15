package httpapi

import (
	"net/http"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// auditorRoutes are the routes a key of role auditor may use: reads of
// its team's audit trail, usage, metrics, limits and lists. Reads that
// hand out a way in (a sandbox's access tokens in GET /sandboxes/{id},
// a new key in GET /teams), files (export, diff, template files) and
// every other route are refused.
var auditorRoutes = map[string]bool{
	"GET /audit":                       true,
	"GET /audit/stream":                true,
	"GET /usage":                       true,
	"GET /teams/{teamID}/metrics":      true,
	"GET /teams/{teamID}/metrics/max":  true,
	"GET /teams/{teamID}/limits":       true,
	"GET /teams/{teamID}/limits/usage": true,
	"GET /sandboxes":                   true,
	"GET /v2/sandboxes":                true,
	"GET /sandboxes/metrics":           true,
	"GET /sandboxes/{id}/metrics":      true,
	"GET /sandboxes/{id}/logs":         true,
	"GET /v2/sandboxes/{id}/logs":      true,
	"GET /sandboxes/{id}/checkpoints":  true,
	"GET /sandboxes/{id}/downloads":    true,
	"GET /snapshots":                   true,
	"GET /secrets":                     true,
	"GET /templates":                   true,
	"GET /v2/templates":                true,
	"GET /approvals":                   true,
	"GET /approvals/stream":            true,
	"GET /ssh-keys":                    true,
}

// errAuditorOnly is the answer to an auditor key on any other route.
var errAuditorOnly = &publicError{
	msg:      "this API key has the auditor role: it may only read its team's audit trail, usage, metrics and lists",
	sentinel: api.ErrPermissionDenied,
	cause:    api.ErrPermissionDenied,
}

// auditorGate refuses a request of an auditor key on a route outside
// auditorRoutes (403, whatever the IDs in its path: no existence
// oracle); other principals pass.
func auditorGate(r *http.Request, pattern string) error {
	if p, ok := tenancy.FromContext(r.Context()); ok && p.Auditor && !auditorRoutes[pattern] {
		return errAuditorOnly
	}
	return nil
}
