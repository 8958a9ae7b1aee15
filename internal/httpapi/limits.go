package httpapi

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Teams says which teams exist.
type Teams interface {
	TeamExists(ctx context.Context, id string) (bool, error)
}

var errTeamNotFound = errorf(api.ErrNotFound, "Team not found")

// principalOf is who r acts for; false for no principal (a request that
// did not authenticate).
func principalOf(r *http.Request) (tenancy.Principal, bool) {
	return tenancy.FromContext(r.Context())
}

// limitsTeam returns the team of a limits route r may see: its own (any
// principal) or any existing team (the admin). Another team is a missing
// one to a principal that is not the admin.
func (h *handler) limitsTeam(r *http.Request) (string, error) {
	if h.quotas == nil {
		return "", errorf(api.ErrUnimplemented, "team limits are not served")
	}
	p, ok := principalOf(r)
	id := r.PathValue("teamID")
	if !ok || (!p.Admin && id != p.Team) {
		return "", errTeamNotFound
	}
	exists := id == tenancy.DefaultTeamID
	if !exists && h.teams != nil {
		var err error
		if exists, err = h.teams.TeamExists(r.Context(), id); err != nil {
			return "", err
		}
	}
	if !exists {
		return "", errTeamNotFound
	}
	return id, nil
}

// getTeamLimits answers GET /teams/{teamID}/limits: the team's limits
// in force (tenancy.Limits), the body PUT takes back.
func (h *handler) getTeamLimits(w http.ResponseWriter, r *http.Request) {
	team, err := h.limitsTeam(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, h.quotas.Limits(team))
}

// getTeamUsage answers GET /teams/{teamID}/limits/usage: what the team's
// sandboxes take now of its limits (tenancy.Usage) and its egress of the
// day.
func (h *handler) getTeamUsage(w http.ResponseWriter, r *http.Request) {
	team, err := h.limitsTeam(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, teamUsage{Usage: h.quotas.Usage(team), EgressBytesToday: h.quotas.EgressToday(team, h.now())})
}

// teamUsage is the answer of GET /teams/{teamID}/limits/usage.
type teamUsage struct {
	tenancy.Usage
	// EgressBytesToday is what the team's flows that ended moved through
	// the egress fence this UTC day.
	EgressBytesToday int64 `json:"egressBytesToday"`
}

// putTeamLimits answers PUT /teams/{teamID}/limits (the admin only): the
// fields the body names replace the team's limits in force, the others
// stay. A negative or unknown field changes nothing.
func (h *handler) putTeamLimits(w http.ResponseWriter, r *http.Request) {
	team, err := h.limitsTeam(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if p, _ := principalOf(r); !p.Admin {
		writeError(w, r, h.log, errorf(api.ErrPermissionDenied, "only the admin may change a team's limits"))
		return
	}
	body, err := io.ReadAll(r.Body)
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		err = errorf(errTooLarge, "request body is larger than %d bytes", tooLarge.Limit)
	} else if err != nil {
		err = errorf(api.ErrInvalidArgument, "reading the request body: %v", err)
	}
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	l, err := h.quotas.Limits(team).Patch(body)
	if err == nil {
		err = h.quotas.Set(r.Context(), team, l)
	}
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, l)
}

// allowRate takes one request of r's key from its team's request rate
// (tenancy.Limits.RequestsPerSecond), setting E2B's RateLimit-* headers;
// a request over it is answered 429 with Retry-After and false returned.
func (h *handler) allowRate(w http.ResponseWriter, r *http.Request) bool {
	p, ok := principalOf(r)
	if h.quotas == nil || !ok {
		return true
	}
	d := h.quotas.Allow(p, h.now())
	if !d.Limited {
		return true
	}
	w.Header().Set("RateLimit-Limit", strconv.Itoa(d.Limit))
	w.Header().Set("RateLimit-Remaining", strconv.Itoa(d.Remaining))
	w.Header().Set("RateLimit-Reset", strconv.Itoa(int(math.Ceil(d.Reset.Seconds()))))
	if d.Allowed {
		return true
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.RetryAfter.Seconds()))))
	writeError(w, r, h.log, errRateLimited)
	return false
}

// errRateLimited is E2B's answer to a request over its rate.
var errRateLimited = errorf(api.ErrResourceExhausted, "Rate limit exceeded")
