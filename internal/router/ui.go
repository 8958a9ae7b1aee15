package router

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	crand "crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/ui"
)

// The dashboard through the router (Options.UI): the router serves the
// dashboard's pages and its session routes itself, and turns a session
// into its credential for the nodes.
//
// Guarantees:
//   - A session is a cookie (uiCookie: HttpOnly, SameSite=Strict, Path=/,
//     Secure on TLS, Max-Age its life) sealed with AES-256-GCM under a key
//     derived from the cluster token, which every router of the cluster
//     holds: any replica opens a session another made, and the routers
//     keep nothing. The sealed value holds the credential, the session's
//     CSRF token and its expiry; no one without the cluster token reads or
//     forges it.
//   - Sign-in asks a live node for the credential's principal (GET
//     /principal) and makes no session when the node refuses it; keys
//     other than the router's own are taken only when the nodes share one
//     database (SharedRecords), as in X-API-Key.
//   - A cookie alone authenticates nothing: a request is the session's
//     only with its CSRF token in X-Fence-CSRF (constant-time compare),
//     an Origin (if sent) equal to its own and a Sec-Fetch-Site (if sent)
//     of same-origin; otherwise 403, and nothing reaches a node. An expired
//     or unreadable cookie is 401.
//   - The router sends the session's credential on to the nodes in
//     X-API-Key (an access token as a Bearer token), which check it on
//     every request: the session's team sees its own sandboxes on every
//     node, and a revoked key ends its sessions at the next request.
//   - The cookie and the CSRF header are removed from every request the
//     router forwards, sandbox traffic included.
//   - Every /ui answer carries the dashboard's Content-Security-Policy.
const (
	uiCookie      = ui.CookieName
	headerUICSRF  = ui.CSRFHeader
	uiPrefix      = "/ui"
	uiSessionPath = "/ui/session"
	// DefaultUISessionTTL is a session's life unless Options.UISessionTTL.
	DefaultUISessionTTL = 12 * time.Hour
)

// uiSeal is the AEAD sealing sessions, keyed from the cluster token.
func uiSeal(token string) cipher.AEAD {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("fence router: dashboard sessions v1"))
	block, err := aes.NewCipher(m.Sum(nil))
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return aead
}

// uiClaims is what a session cookie seals.
type uiClaims struct {
	Key     string `json:"k"`
	CSRF    string `json:"c"`
	Expires int64  `json:"e"` // unix seconds
}

// uiSessionInfo is what the session routes answer: never the credential.
type uiSessionInfo struct {
	CSRFToken string    `json:"csrfToken"`
	Team      string    `json:"team"`
	KeyID     string    `json:"keyID"`
	Admin     bool      `json:"admin"`
	Expires   time.Time `json:"expires"`
}

func (rt *Router) sealSession(c uiClaims) string {
	b, _ := json.Marshal(c)
	nonce := make([]byte, rt.seal.NonceSize())
	_, _ = crand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(rt.seal.Seal(nonce, nonce, b, []byte(uiCookie)))
}

// openSession returns the live session of r's cookie.
func (rt *Router) openSession(r *http.Request) (uiClaims, bool) {
	ck, err := r.Cookie(uiCookie)
	if err != nil {
		return uiClaims{}, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(ck.Value)
	n := rt.seal.NonceSize()
	if err != nil || len(raw) < n {
		return uiClaims{}, false
	}
	b, err := rt.seal.Open(nil, raw[:n], raw[n:], []byte(uiCookie))
	var c uiClaims
	if err != nil || json.Unmarshal(b, &c) != nil || c.Key == "" || c.CSRF == "" {
		return uiClaims{}, false
	}
	if !rt.now().Before(time.Unix(c.Expires, 0)) {
		return uiClaims{}, false
	}
	return c, true
}

// hasSession reports whether r carries a session cookie and no other
// credential.
func hasSession(r *http.Request) bool {
	if _, err := r.Cookie(uiCookie); err != nil {
		return false
	}
	return r.Header.Get("X-API-Key") == "" && r.Header.Get("Authorization") == ""
}

// sessionCredential authenticates r by its session and puts the
// session's credential on r for the nodes. It writes the refusal and
// reports false when r is not the session's.
func (rt *Router) sessionCredential(w http.ResponseWriter, r *http.Request) bool {
	c, ok := rt.openSession(r)
	if !ok {
		writeErr(w, http.StatusUnauthorized, "the dashboard session expired or was signed out: sign in again")
		return false
	}
	if err := ui.SameOrigin(r); err != nil {
		writeErr(w, http.StatusForbidden, err.Error())
		return false
	}
	got := r.Header.Get(headerUICSRF)
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(c.CSRF)) != 1 {
		writeErr(w, http.StatusForbidden, "a dashboard request needs its session's CSRF token in the "+headerUICSRF+" header")
		return false
	}
	setCredential(r.Header, c.Key)
	return true
}

// setCredential puts credential v on h as a client would send it.
func setCredential(h http.Header, v string) {
	if strings.HasPrefix(v, "sk_e2b_") {
		h.Set("Authorization", "Bearer "+v)
	} else {
		h.Set("X-API-Key", v)
	}
}

func isUIPath(p string) bool { return p == uiPrefix || strings.HasPrefix(p, uiPrefix+"/") }

// serveUI serves /ui: 404 without the dashboard, else its session routes
// and its pages.
func (rt *Router) serveUI(w http.ResponseWriter, r *http.Request) {
	if rt.ui == nil {
		writeErr(w, http.StatusNotFound, "this router serves no dashboard (--no-ui)")
		return
	}
	ui.SecurityHeaders(w.Header())
	if r.URL.Path == uiSessionPath {
		w.Header().Set("Cache-Control", "no-store")
		rt.serveUISession(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeErr(w, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path)
		return
	}
	if r.URL.Path == uiPrefix {
		http.Redirect(w, r, uiPrefix+"/", http.StatusFound)
		return
	}
	http.StripPrefix(uiPrefix, rt.ui).ServeHTTP(w, r)
}

// serveUISession serves the session routes:
//
//	POST   /ui/session {apiKey}  sign in: 201, the cookie set
//	GET    /ui/session           the session (its CSRF token), for a page load
//	DELETE /ui/session           sign out (CSRF token required): 204
func (rt *Router) serveUISession(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
		rt.uiLogin(w, r)
	case http.MethodGet:
		if err := ui.SameOrigin(r); err != nil {
			writeErr(w, http.StatusForbidden, err.Error())
			return
		}
		c, ok := rt.openSession(r)
		if !ok {
			writeErr(w, http.StatusUnauthorized, "no dashboard session: sign in")
			return
		}
		p, ok := rt.principal(w, r, c.Key)
		if !ok {
			return
		}
		writeJSON(w, http.StatusOK, uiSessionInfo{CSRFToken: c.CSRF, Team: p.Team, KeyID: p.KeyID, Admin: p.Admin,
			Expires: time.Unix(c.Expires, 0).UTC()})
	case http.MethodDelete:
		if !rt.sessionCredential(w, r) {
			return
		}
		http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
			Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
		w.WriteHeader(http.StatusNoContent)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		writeErr(w, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path)
	}
}

func (rt *Router) uiLogin(w http.ResponseWriter, r *http.Request) {
	if err := ui.SameOrigin(r); err != nil {
		writeErr(w, http.StatusForbidden, err.Error())
		return
	}
	var body struct {
		APIKey string `json:"apiKey"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
	if err := dec.Decode(&body); err != nil {
		writeErr(w, http.StatusBadRequest, "the body must be {\"apiKey\": \"…\"}: "+err.Error())
		return
	}
	key := strings.TrimSpace(body.APIKey)
	if key == "" {
		writeErr(w, http.StatusBadRequest, "apiKey is required")
		return
	}
	own := len(rt.apiKey) > 0 && subtle.ConstantTimeCompare([]byte(key), rt.apiKey) == 1
	if !own && !rt.teamKeys {
		writeErr(w, http.StatusUnauthorized, "invalid API key")
		return
	}
	p, ok := rt.principal(w, r, key)
	if !ok {
		return
	}
	exp := rt.now().Add(rt.uiTTL).Truncate(time.Second)
	csrf := make([]byte, 32)
	_, _ = crand.Read(csrf)
	c := uiClaims{Key: key, CSRF: hex.EncodeToString(csrf), Expires: exp.Unix()}
	http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: rt.sealSession(c), Path: "/", Expires: exp,
		MaxAge: int(rt.uiTTL / time.Second), HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	writeJSON(w, http.StatusCreated, uiSessionInfo{CSRFToken: c.CSRF, Team: p.Team, KeyID: p.KeyID, Admin: p.Admin, Expires: exp.UTC()})
}

// principal asks a live node who credential key is; a node's refusal
// (401 for a wrong or revoked key) is written as is.
func (rt *Router) principal(w http.ResponseWriter, r *http.Request, key string) (api.Principal, bool) {
	nodes := rt.nodes.Nodes()
	if len(nodes) == 0 {
		writeErr(w, http.StatusServiceUnavailable, "no fence node is live")
		return api.Principal{}, false
	}
	n := nodes[rand.IntN(len(nodes))]
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, strings.TrimSuffix(n.URL, "/")+"/principal", nil)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return api.Principal{}, false
	}
	setCredential(req.Header, key)
	req.Header.Set(cluster.HeaderToken, rt.token)
	resp, err := rt.client.Do(req)
	if err != nil {
		writeErr(w, http.StatusBadGateway, "fence node "+n.Name+" did not answer")
		return api.Principal{}, false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var p api.Principal
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &p) != nil {
		status := resp.StatusCode
		if status == http.StatusOK {
			status = http.StatusBadGateway
		}
		var e api.Error
		if json.Unmarshal(b, &e) != nil || e.Message == "" {
			e.Message = "fence node " + n.Name + " answered " + resp.Status
		}
		writeErr(w, status, e.Message)
		return api.Principal{}, false
	}
	return p, true
}
