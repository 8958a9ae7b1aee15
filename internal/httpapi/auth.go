package httpapi

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Identity is the part of *store.Store the API authenticates requests
// with and keeps teams, API keys and access tokens in.
type Identity interface {
	Authenticate(ctx context.Context, k store.Kind, value string) (*store.Credential, error)
	TouchCredential(ctx context.Context, id string, t time.Time) error
	Team(ctx context.Context, id string) (*store.Team, error)
	Teams(ctx context.Context) ([]*store.Team, error)
	CreateTeam(ctx context.Context, name string) (*store.Team, error)
	Mint(ctx context.Context, team string, k store.Kind, name, createdBy string) (string, *store.Credential, error)
	MintRole(ctx context.Context, team string, k store.Kind, name, createdBy, role string) (string, *store.Credential, error)
	Credentials(ctx context.Context, team string, k store.Kind) ([]*store.Credential, error)
	RenameCredential(ctx context.Context, team string, k store.Kind, id, name string) error
	RevokeCredential(ctx context.Context, team string, k store.Kind, id string, t time.Time) error
}

var _ Identity = (*store.Store)(nil)

// HeaderTeamID names the team an admin request acts for (E2B's
// AdminTeamAuth).
const HeaderTeamID = "X-Team-ID"

// headerAdminToken carries the admin credential on E2B's admin routes.
const headerAdminToken = "X-Admin-Token"

// caller is who an authenticated request comes from: its principal and
// the kind of credential it showed ("" for the bootstrap key).
type caller struct {
	p    tenancy.Principal
	kind store.Kind
}

type callerKey struct{}

func callerFrom(ctx context.Context) caller {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c
}

// actor is the audit trail's name for p: its team and key ID, never the
// key.
func actor(p tenancy.Principal) string {
	return "team:" + p.Team + " key:" + p.KeyID
}

// authenticate resolves a control-plane request's credential into its
// caller: the bootstrap key (X-API-Key, X-Admin-Token, or a Bearer token on
// GET /metrics) is the admin of the default team; a team's API key
// (X-API-Key) and access token (Authorization: Bearer sk_e2b_…) act for
// their team. Every request looks its credential up again, so a revoked
// one fails on its next request. An admin may act for another team with
// X-Team-ID.
func (h *handler) authenticate(r *http.Request) (caller, error) {
	c, err := h.credential(r)
	if err != nil {
		return caller{}, err
	}
	team := r.Header.Get(HeaderTeamID)
	if team == "" || team == c.p.Team {
		return c, nil
	}
	if !c.p.Admin {
		return caller{}, errorf(errUnauthenticated, "the %s header names a team this credential does not belong to", HeaderTeamID)
	}
	if !isUUID(team) {
		return caller{}, errorf(api.ErrInvalidArgument, "Invalid team ID")
	}
	if h.identity == nil {
		return caller{}, errorf(api.ErrNotFound, "Team not found")
	}
	if _, err := h.identity.Team(r.Context(), team); err != nil {
		if errors.Is(err, api.ErrNotFound) {
			return caller{}, errorf(api.ErrNotFound, "Team not found")
		}
		return caller{}, err
	}
	c.p.Team = team
	return c, nil
}

func (h *handler) credential(r *http.Request) (caller, error) {
	bootstrap := caller{p: tenancy.Principal{Team: tenancy.DefaultTeamID, KeyID: tenancy.BootstrapKeyID, Admin: true}}
	key := r.Header.Get(api.HeaderAPIKey)
	if key == "" {
		key = r.Header.Get(headerAdminToken)
	}
	bearer, hasBearer := cutPrefixFold(r.Header.Get("Authorization"), "Bearer ")
	bearer = strings.TrimSpace(bearer)
	switch {
	case key != "":
		if h.isBootstrap(key) {
			return bootstrap, nil
		}
		return h.lookup(r.Context(), store.KindAPIKey, key)
	case hasBearer && strings.HasPrefix(bearer, store.KindAccessToken.Prefix()):
		return h.lookup(r.Context(), store.KindAccessToken, bearer)
	case hasBearer && r.URL.Path == "/metrics":
		// Prometheus sends its credential as a Bearer token.
		if h.isBootstrap(bearer) {
			return bootstrap, nil
		}
		return h.lookup(r.Context(), store.KindAPIKey, bearer)
	case h.ui != nil && hasUISession(r):
		return h.sessionCaller(r)
	}
	return caller{}, errorf(errUnauthenticated, "missing API key: send it in the X-API-Key header")
}

func (h *handler) isBootstrap(v string) bool {
	return len(h.apiKey) > 0 && subtle.ConstantTimeCompare([]byte(v), h.apiKey) == 1
}

// lookup authenticates a team's credential of kind k.
func (h *handler) lookup(ctx context.Context, k store.Kind, v string) (caller, error) {
	msg := "invalid API key"
	if k == store.KindAccessToken {
		msg = "invalid access token"
	}
	if h.identity == nil || !store.WellFormed(k, v) {
		return caller{}, errorf(errUnauthenticated, "%s", msg)
	}
	cred, err := h.identity.Authenticate(ctx, k, v)
	if errors.Is(err, api.ErrUnauthenticated) {
		return caller{}, errorf(errUnauthenticated, "%s", msg)
	}
	if err != nil {
		return caller{}, err
	}
	if now := h.now(); now.Sub(cred.LastUsed) > time.Minute {
		if err := h.identity.TouchCredential(ctx, cred.ID, now); err != nil {
			h.log.WarnContext(ctx, "recording a key's use", "key_id", cred.ID, "err", err)
		}
	}
	return caller{p: cred.Principal(), kind: k}, nil
}

// isUUID reports whether s is a UUID in its 36-character form.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') && (c < 'A' || c > 'F') {
				return false
			}
		}
	}
	return true
}

// revocations ends the requests of a credential when it is revoked: each
// authenticated request runs in a context watch gives it, which
// revoke(keyID) cancels. Open streams (GET /audit/stream, proxied
// streams) end with it; every later request fails authentication.
type revocations struct {
	mu      sync.Mutex
	waiting map[string]map[*context.CancelFunc]struct{}
}

// watch returns ctx ended when key id is revoked, and the func that stops
// watching (call it when the request ends).
func (rv *revocations) watch(ctx context.Context, id string) (context.Context, func()) {
	if id == "" || id == tenancy.BootstrapKeyID {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	rv.mu.Lock()
	if rv.waiting == nil {
		rv.waiting = map[string]map[*context.CancelFunc]struct{}{}
	}
	set := rv.waiting[id]
	if set == nil {
		set = map[*context.CancelFunc]struct{}{}
		rv.waiting[id] = set
	}
	set[&cancel] = struct{}{}
	rv.mu.Unlock()
	return ctx, func() {
		rv.mu.Lock()
		delete(set, &cancel)
		if cur, ok := rv.waiting[id]; ok && len(cur) == 0 {
			delete(rv.waiting, id)
		}
		rv.mu.Unlock()
		cancel()
	}
}

// revoke ends the requests in flight of key id.
func (rv *revocations) revoke(id string) {
	rv.mu.Lock()
	set := rv.waiting[id]
	delete(rv.waiting, id)
	// The set is read under the lock: a request ending meanwhile deletes
	// itself from it.
	cancels := make([]context.CancelFunc, 0, len(set))
	for c := range set {
		cancels = append(cancels, *c)
	}
	rv.mu.Unlock()
	for _, c := range cancels {
		c()
	}
}

// withCaller returns r acting for c: its principal in the context, ended
// when c's key is revoked; call the func returned when r is served.
func (h *handler) withCaller(r *http.Request, c caller) (*http.Request, func()) {
	ctx := tenancy.NewContext(r.Context(), c.p)
	ctx = context.WithValue(ctx, callerKey{}, c)
	ctx, stop := h.revoked.watch(ctx, c.p.KeyID)
	return r.WithContext(ctx), stop
}
