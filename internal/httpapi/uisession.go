package httpapi

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/ui"
)

// The dashboard (/ui) signs in with a credential exchanged for a session
// cookie; its pages then call the API's routes with that cookie and the
// session's CSRF token.
//
// Guarantees:
//   - The cookie (uiCookie) is HttpOnly, SameSite=Strict, Path=/, Secure
//     on TLS, and expires with the session (Options.UISessionTTL). Its
//     value is 256 random bits; the daemon keeps only its SHA-256.
//   - A cookie alone authenticates nothing: a request is the session's
//     only with the session's CSRF token in the X-Fence-CSRF header
//     (compared in constant time), which no other origin can read or send,
//     and, when the browser names them, an Origin equal to the request's
//     own and a Sec-Fetch-Site of same-origin. Otherwise it is refused (403)
//     and changes nothing.
//   - A session keeps its credential in memory (never on disk) and looks
//     it up again on every request, as a key sent in X-API-Key is: a
//     revoked key ends its sessions at once. A session that expired or was
//     signed out answers 401 like an unknown one.
//   - Sessions belong to their credential's team; no route names one.
const (
	uiCookie     = ui.CookieName
	headerUICSRF = ui.CSRFHeader
	// uiPrefix is the dashboard's path; uiSessionPath its session routes.
	uiPrefix      = "/ui"
	uiSessionPath = "/ui/session"
	// defaultUISessionTTL is a session's life unless Options.UISessionTTL.
	defaultUISessionTTL = 12 * time.Hour
	// maxUISessions bounds the sessions kept at once; a login beyond it
	// drops the session closest to its expiry.
	maxUISessions = 4096
)

type uiSession struct {
	key     string // the credential signed in with
	csrf    string
	expires time.Time
}

// uiSessions keeps the dashboard's sessions in memory, by the SHA-256 of
// their cookie.
type uiSessions struct {
	mu   sync.Mutex
	byID map[[sha256.Size]byte]*uiSession
}

func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *uiSessions) add(key string, now time.Time, ttl time.Duration) (cookie string, sess *uiSession) {
	cookie = randomToken()
	sess = &uiSession{key: key, csrf: randomToken(), expires: now.Add(ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[[sha256.Size]byte]*uiSession{}
	}
	for id, o := range s.byID {
		if !now.Before(o.expires) {
			delete(s.byID, id)
		}
	}
	if len(s.byID) >= maxUISessions {
		var first [sha256.Size]byte
		var soonest *uiSession
		for id, o := range s.byID {
			if soonest == nil || o.expires.Before(soonest.expires) {
				first, soonest = id, o
			}
		}
		delete(s.byID, first)
	}
	s.byID[sha256.Sum256([]byte(cookie))] = sess
	return cookie, sess
}

// get returns the live session of cookie, or nil.
func (s *uiSessions) get(cookie string, now time.Time) *uiSession {
	id := sha256.Sum256([]byte(cookie))
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.byID[id]
	if sess == nil {
		return nil
	}
	if !now.Before(sess.expires) {
		delete(s.byID, id)
		return nil
	}
	return sess
}

func (s *uiSessions) remove(cookie string) {
	s.mu.Lock()
	delete(s.byID, sha256.Sum256([]byte(cookie)))
	s.mu.Unlock()
}

// hasUISession reports whether r carries a dashboard session cookie and
// no other credential.
func hasUISession(r *http.Request) bool {
	if _, err := r.Cookie(uiCookie); err != nil {
		return false
	}
	return r.Header.Get(api.HeaderAPIKey) == "" && r.Header.Get(headerAdminToken) == "" && r.Header.Get("Authorization") == ""
}

// sameOrigin is ui.SameOrigin, refused as permission denied.
func sameOrigin(r *http.Request) error {
	if err := ui.SameOrigin(r); err != nil {
		return errorf(api.ErrPermissionDenied, "%v", err)
	}
	return nil
}

// sessionCaller authenticates a request by its dashboard session: the
// cookie, the CSRF header and the browser's origin headers, then the
// session's credential looked up again.
func (h *handler) sessionCaller(r *http.Request) (caller, error) {
	ck, err := r.Cookie(uiCookie)
	if err != nil {
		return caller{}, errorf(errUnauthenticated, "missing API key: send it in the X-API-Key header")
	}
	sess := h.sessions.get(ck.Value, h.now())
	if sess == nil {
		return caller{}, errorf(errUnauthenticated, "the dashboard session expired or was signed out: sign in again")
	}
	if err := sameOrigin(r); err != nil {
		return caller{}, err
	}
	got := r.Header.Get(headerUICSRF)
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) != 1 {
		return caller{}, errorf(api.ErrPermissionDenied, "a dashboard request needs its session's CSRF token in the %s header", headerUICSRF)
	}
	c, err := h.keyCaller(r, sess.key)
	if errors.Is(err, errUnauthenticated) {
		h.sessions.remove(ck.Value)
		return caller{}, errorf(errUnauthenticated, "the dashboard session's key was revoked: sign in again")
	}
	return c, err
}

// keyCaller authenticates credential v as if sent in X-API-Key (a team's
// access token as a Bearer token).
func (h *handler) keyCaller(r *http.Request, v string) (caller, error) {
	r2 := r.Clone(r.Context())
	r2.Header = http.Header{}
	if strings.HasPrefix(v, "sk_e2b_") {
		r2.Header.Set("Authorization", "Bearer "+v)
	} else {
		r2.Header.Set(api.HeaderAPIKey, v)
	}
	return h.credential(r2)
}

// uiSessionInfo is what the session routes answer: never the credential.
type uiSessionInfo struct {
	CSRFToken string    `json:"csrfToken"`
	Team      string    `json:"team"`
	KeyID     string    `json:"keyID"`
	Admin     bool      `json:"admin"`
	Expires   time.Time `json:"expires"`
}

// serveUISession serves the dashboard's session routes:
//
//	POST   /ui/session {apiKey}  sign in: 201, the cookie set
//	GET    /ui/session           the session (its CSRF token), for a page load
//	DELETE /ui/session           sign out (CSRF token required): 204
func (h *handler) serveUISession(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	switch r.Method {
	case http.MethodPost:
		h.uiLogin(w, r)
	case http.MethodGet:
		// Only the dashboard's own pages read their session's token.
		if err := sameOrigin(r); err != nil {
			writeError(w, r, h.log, err)
			return
		}
		ck, err := r.Cookie(uiCookie)
		var sess *uiSession
		if err == nil {
			sess = h.sessions.get(ck.Value, h.now())
		}
		if sess == nil {
			writeError(w, r, h.log, errorf(errUnauthenticated, "no dashboard session: sign in"))
			return
		}
		c, err := h.keyCaller(r, sess.key)
		if err != nil {
			h.sessions.remove(ck.Value)
			writeError(w, r, h.log, err)
			return
		}
		writeJSON(w, http.StatusOK, uiSessionInfo{CSRFToken: sess.csrf, Team: c.p.Team, KeyID: c.p.KeyID, Admin: c.p.Admin, Expires: sess.expires})
	case http.MethodDelete:
		c, err := h.sessionCaller(r)
		if err != nil {
			writeError(w, r, h.log, err)
			return
		}
		ck, _ := r.Cookie(uiCookie)
		h.sessions.remove(ck.Value)
		http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
		h.recordUI(r, actor(c.p), "DELETE "+uiSessionPath, http.StatusNoContent)
		w.WriteHeader(http.StatusNoContent)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		writeError(w, r, h.log, errorf(errMethodNotAllowed, "method %s is not allowed on %s", r.Method, r.URL.Path))
	}
}

func (h *handler) uiLogin(w http.ResponseWriter, r *http.Request) {
	if err := sameOrigin(r); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	var body struct {
		APIKey string `json:"apiKey"`
	}
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	key := strings.TrimSpace(body.APIKey)
	if key == "" {
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "apiKey is required"))
		return
	}
	c, err := h.keyCaller(r, key)
	if err != nil {
		if errors.Is(err, errUnauthenticated) {
			h.recordUI(r, "unauthenticated", "POST "+uiSessionPath, http.StatusUnauthorized)
		}
		writeError(w, r, h.log, err)
		return
	}
	now := h.now()
	cookie, sess := h.sessions.add(key, now, h.uiTTL)
	http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: cookie, Path: "/", Expires: sess.expires,
		MaxAge: int(h.uiTTL / time.Second), HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	h.recordUI(r, actor(c.p), "POST "+uiSessionPath, http.StatusCreated)
	writeJSON(w, http.StatusCreated, uiSessionInfo{CSRFToken: sess.csrf, Team: c.p.Team, KeyID: c.p.KeyID, Admin: c.p.Admin, Expires: sess.expires})
}

// recordUI records a sign-in or sign-out in the audit trail.
func (h *handler) recordUI(r *http.Request, who, route string, status int) {
	if h.sink == nil {
		return
	}
	method, _, _ := strings.Cut(route, " ")
	h.sink.Append(context.WithoutCancel(r.Context()), audit.Event{Type: audit.TypeAPI, Actor: who,
		Data: map[string]any{"method": method, "route": route, "path": r.URL.Path, "status": status}})
}

// serveUI serves the dashboard: its session routes, then its assets.
func (h *handler) serveUI(w http.ResponseWriter, r *http.Request) {
	ui.SecurityHeaders(w.Header())
	if r.URL.Path == uiSessionPath {
		h.serveUISession(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, r, h.log, errorf(errMethodNotAllowed, "method %s is not allowed on %s", r.Method, r.URL.Path))
		return
	}
	if r.URL.Path == uiPrefix {
		http.Redirect(w, r, uiPrefix+"/", http.StatusFound)
		return
	}
	http.StripPrefix(uiPrefix, h.ui).ServeHTTP(w, r)
}

func isUIPath(p string) bool {
	return p == uiPrefix || strings.HasPrefix(p, uiPrefix+"/")
}
