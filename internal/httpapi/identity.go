package httpapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// The identity routes: E2B's /teams, /api-keys, /access-tokens and admin
// key routes, and fence's /admin/teams. A team's API key cannot use them
// (as in E2B): they take an access token of the team, or the bootstrap
// key (the admin; X-Team-ID picks the team it acts for). A value is shown
// once, in the answer that makes it; lists show masks.

// identityCaller returns the caller of a key-management route, or the
// error to answer: 501 without an Identity, 401 for an API key.
func (h *handler) identityCaller(r *http.Request) (caller, error) {
	if h.identity == nil {
		return caller{}, errorf(api.ErrUnimplemented, "teams and keys are not kept by this daemon")
	}
	c := callerFrom(r.Context())
	if !c.p.Admin && c.kind != store.KindAccessToken {
		return caller{}, errorf(errUnauthenticated,
			"%s needs an access token (Authorization: Bearer sk_e2b_…) or the admin key, not an API key", r.URL.Path)
	}
	return c, nil
}

// adminOnly serves next to the admin alone: the daemon-wide Prometheus
// metrics tell of every team.
func (h *handler) adminOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !callerFrom(r.Context()).p.Admin {
			writeError(w, r, h.log, errorf(errUnauthenticated, "%s needs the admin key", r.URL.Path))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// adminCaller returns the caller of an admin route, or the error to
// answer.
func (h *handler) adminCaller(r *http.Request) (caller, error) {
	if h.identity == nil {
		return caller{}, errorf(api.ErrUnimplemented, "teams and keys are not kept by this daemon")
	}
	c := callerFrom(r.Context())
	if !c.p.Admin {
		return caller{}, errorf(errUnauthenticated, "%s needs the admin key", r.URL.Path)
	}
	return c, nil
}

func mask(c *store.Credential) api.IdentifierMask {
	return api.IdentifierMask{Prefix: c.Kind.Prefix(), ValueLength: c.ValueLength,
		MaskedValuePrefix: c.MaskPrefix, MaskedValueSuffix: c.MaskSuffix}
}

func teamAPIKey(c *store.Credential) api.TeamAPIKey {
	k := api.TeamAPIKey{ID: c.ID, Name: c.Name, Mask: mask(c), CreatedAt: c.CreatedAt, Role: c.Role}
	if c.CreatedBy != "" {
		k.CreatedBy = &api.TeamUser{ID: c.CreatedBy}
	}
	if !c.LastUsed.IsZero() {
		t := c.LastUsed
		k.LastUsed = &t
	}
	return k
}

func accessToken(c *store.Credential) api.AccessToken {
	return api.AccessToken{ID: c.ID, Name: c.Name, Mask: mask(c), CreatedAt: c.CreatedAt}
}

// decodeName reads a {"name": …} body.
func decodeName(r *http.Request) (string, error) {
	body, err := decodeKeyBody(r)
	return body.Name, err
}

// decodeKeyBody reads a credential's body: its name (checked as
// decodeName does) and role.
func decodeKeyBody(r *http.Request) (api.NewTeamAPIKey, error) {
	var body api.NewTeamAPIKey
	if err := decodeJSON(r, &body, false); err != nil {
		return body, err
	}
	if body.Name == "" {
		return body, errorf(api.ErrInvalidArgument, "name is required")
	}
	if len(body.Name) > store.MaxNameLen {
		return body, errorf(api.ErrInvalidArgument, "name is %d bytes, more than %d", len(body.Name), store.MaxNameLen)
	}
	return body, nil
}

// keyID is the credential ID in the path, or the 400 to answer.
func keyID(r *http.Request, param string) (string, error) {
	id := r.PathValue(param)
	if !isUUID(id) {
		return "", errorf(api.ErrInvalidArgument, "Error when parsing API key ID: not a UUID")
	}
	return id, nil
}

// createdBy is the key ID a new credential's record names as its maker.
func createdBy(p tenancy.Principal) string {
	return p.KeyID
}

// mint answers a new credential of kind k for team.
func (h *handler) mint(w http.ResponseWriter, r *http.Request, team string, k store.Kind, by string) {
	body, err := decodeKeyBody(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	value, c, err := h.identity.MintRole(r.Context(), team, k, body.Name, by, body.Role)
	if errors.Is(err, store.ErrTeamNotFound) {
		err = errorf(api.ErrNotFound, "Team not found")
	}
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	if k == store.KindAccessToken {
		writeJSON(w, http.StatusCreated, api.CreatedAccessToken{AccessToken: accessToken(c), Token: value})
		return
	}
	writeJSON(w, http.StatusCreated, api.CreatedTeamAPIKey{TeamAPIKey: teamAPIKey(c), Key: value})
}

// revoke revokes team's credential id of kind k and ends its requests in
// flight.
func (h *handler) revoke(w http.ResponseWriter, r *http.Request, team string, k store.Kind, id, notFound string) {
	err := h.identity.RevokeCredential(r.Context(), team, k, id, h.now())
	if errors.Is(err, store.ErrCredentialNotFound) {
		err = errorf(api.ErrNotFound, "%s", notFound)
	}
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	h.revoked.revoke(id)
	w.WriteHeader(http.StatusNoContent)
}

// listCredentials answers team's live credentials of kind k, each as show
// makes it.
func listCredentials[T any](h *handler, w http.ResponseWriter, r *http.Request, team string, k store.Kind, show func(*store.Credential) T) {
	creds, err := h.identity.Credentials(r.Context(), team, k)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	out := make([]T, 0, len(creds))
	for _, c := range creds {
		out = append(out, show(c))
	}
	writeJSON(w, http.StatusOK, out)
}

// listAPIKeys answers GET /api-keys: the team's live keys, masked.
func (h *handler) listAPIKeys(w http.ResponseWriter, r *http.Request) {
	c, err := h.identityCaller(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	listCredentials(h, w, r, c.p.Team, store.KindAPIKey, teamAPIKey)
}

// createAPIKey answers POST /api-keys.
func (h *handler) createAPIKey(w http.ResponseWriter, r *http.Request) {
	c, err := h.identityCaller(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	h.mint(w, r, c.p.Team, store.KindAPIKey, createdBy(c.p))
}

// renameAPIKey answers PATCH /api-keys/{apiKeyID}: 202, as E2B.
func (h *handler) renameAPIKey(w http.ResponseWriter, r *http.Request) {
	c, err := h.identityCaller(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	id, err := keyID(r, "apiKeyID")
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	name, err := decodeName(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	err = h.identity.RenameCredential(r.Context(), c.p.Team, store.KindAPIKey, id, name)
	if errors.Is(err, store.ErrCredentialNotFound) {
		err = errorf(api.ErrNotFound, "id not found")
	}
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// deleteAPIKey answers DELETE /api-keys/{apiKeyID}: the key stops working
// at once.
func (h *handler) deleteAPIKey(w http.ResponseWriter, r *http.Request) {
	c, err := h.identityCaller(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	id, err := keyID(r, "apiKeyID")
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	h.revoke(w, r, c.p.Team, store.KindAPIKey, id, "id not found")
}

// listAccessTokens answers GET /access-tokens (fence's: E2B has no list).
func (h *handler) listAccessTokens(w http.ResponseWriter, r *http.Request) {
	c, err := h.identityCaller(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	listCredentials(h, w, r, c.p.Team, store.KindAccessToken, accessToken)
}

// createAccessToken answers POST /access-tokens.
func (h *handler) createAccessToken(w http.ResponseWriter, r *http.Request) {
	c, err := h.identityCaller(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	h.mint(w, r, c.p.Team, store.KindAccessToken, createdBy(c.p))
}

// deleteAccessToken answers DELETE /access-tokens/{accessTokenID}.
func (h *handler) deleteAccessToken(w http.ResponseWriter, r *http.Request) {
	c, err := h.identityCaller(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	id, err := keyID(r, "accessTokenID")
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	h.revoke(w, r, c.p.Team, store.KindAccessToken, id, "id not found")
}

// listTeams answers GET /teams as E2B does: the caller's team, with a new
// API key named "CLI login/configure" (the E2B CLI stores it).
func (h *handler) listTeams(w http.ResponseWriter, r *http.Request) {
	c, err := h.identityCaller(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	t, err := h.identity.Team(r.Context(), c.p.Team)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	value, _, err := h.identity.Mint(r.Context(), t.ID, store.KindAPIKey, "CLI login/configure", createdBy(c.p))
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, []api.Team{{TeamID: t.ID, Name: t.Name, APIKey: value, IsDefault: true}})
}

func teamInfo(t *store.Team) api.TeamInfo {
	return api.TeamInfo{TeamID: t.ID, Name: t.Name, CreatedAt: t.CreatedAt}
}

// adminListTeams answers GET /admin/teams: every team.
func (h *handler) adminListTeams(w http.ResponseWriter, r *http.Request) {
	if _, err := h.adminCaller(r); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	teams, err := h.identity.Teams(r.Context())
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	out := make([]api.TeamInfo, 0, len(teams))
	for _, t := range teams {
		out = append(out, teamInfo(t))
	}
	writeJSON(w, http.StatusOK, out)
}

// adminCreateTeam answers POST /admin/teams.
func (h *handler) adminCreateTeam(w http.ResponseWriter, r *http.Request) {
	if _, err := h.adminCaller(r); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	var body api.NewTeam
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	t, err := h.identity.CreateTeam(r.Context(), body.Name)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, teamInfo(t))
}

// adminTeam is the team in an admin route's path, or the error to answer:
// 400 for a malformed ID, 404 for an unknown team.
func (h *handler) adminTeam(r *http.Request) (string, error) {
	if _, err := h.adminCaller(r); err != nil {
		return "", err
	}
	team := r.PathValue("teamID")
	if !isUUID(team) {
		return "", errorf(api.ErrInvalidArgument, "Invalid team ID")
	}
	if _, err := h.identity.Team(r.Context(), team); err != nil {
		if errors.Is(err, api.ErrNotFound) {
			return "", errorf(api.ErrNotFound, "Team not found")
		}
		return "", err
	}
	return team, nil
}

// adminListAPIKeys answers GET /admin/teams/{teamID}/api-keys (fence's).
func (h *handler) adminListAPIKeys(w http.ResponseWriter, r *http.Request) {
	team, err := h.adminTeam(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	listCredentials(h, w, r, team, store.KindAPIKey, teamAPIKey)
}

// adminCreateAPIKey answers POST /admin/teams/{teamID}/api-keys: a key
// created by no one (createdBy null), as E2B.
func (h *handler) adminCreateAPIKey(w http.ResponseWriter, r *http.Request) {
	team, err := h.adminTeam(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	h.mint(w, r, team, store.KindAPIKey, "")
}

// adminDeleteAPIKey answers DELETE /admin/teams/{teamID}/api-keys/{apiKeyID}.
func (h *handler) adminDeleteAPIKey(w http.ResponseWriter, r *http.Request) {
	team, err := h.adminTeam(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	id, err := keyID(r, "apiKeyID")
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	h.revoke(w, r, team, store.KindAPIKey, id, "API key not found")
}

// TeamSandboxes counts and kills sandboxes by team, for the admin routes.
type TeamSandboxes interface {
	// RunningCounts returns the number of running sandboxes of each team
	// that has any.
	RunningCounts(ctx context.Context) (map[string]int, error)
	// KillTeam kills every running sandbox of team and says how many it
	// killed and how many it failed to.
	KillTeam(ctx context.Context, team string) (killed, failed int, err error)
}

// adminRunningCounts answers GET /admin/sandboxes/running-counts:
// {"<team>": n}, teams with none left out.
func (h *handler) adminRunningCounts(w http.ResponseWriter, r *http.Request) {
	if _, err := h.adminCaller(r); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if h.teamBoxes == nil {
		writeError(w, r, h.log, errorf(api.ErrUnimplemented, "this daemon does not count sandboxes by team"))
		return
	}
	counts, err := h.teamBoxes.RunningCounts(r.Context())
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	out := make(map[string]int, len(counts))
	for team, n := range counts {
		if n > 0 {
			out[team] = n
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// adminKillTeam answers POST /admin/teams/{teamID}/sandboxes/kill: every
// running sandbox of the team killed; an unknown team has none (zeros),
// as E2B answers.
func (h *handler) adminKillTeam(w http.ResponseWriter, r *http.Request) {
	if _, err := h.adminCaller(r); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	team := r.PathValue("teamID")
	if !isUUID(team) {
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "Invalid team ID"))
		return
	}
	if h.teamBoxes == nil {
		writeError(w, r, h.log, errorf(api.ErrUnimplemented, "this daemon does not kill sandboxes by team"))
		return
	}
	killed, failed, err := h.teamBoxes.KillTeam(r.Context(), team)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, api.KilledSandboxes{KilledCount: killed, FailedCount: failed})
}
