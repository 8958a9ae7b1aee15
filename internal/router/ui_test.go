package router

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/cluster"
)

// uiNode is a fake node: GET /principal knows two keys, and every other
// request is recorded.
type uiNode struct {
	mu   sync.Mutex
	seen []http.Header
	srv  *httptest.Server
}

func newUINode(t *testing.T) *uiNode {
	n := &uiNode{}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(cluster.HeaderToken) != "tok" {
			writeErr(w, http.StatusForbidden, "no cluster token")
			return
		}
		if r.URL.Path == "/principal" {
			if r.Header.Get("Authorization") == "Bearer sk_e2b_token" {
				writeJSON(w, http.StatusOK, api.Principal{Team: "t1", KeyID: "tok1"})
				return
			}
			switch r.Header.Get("X-API-Key") {
			case "e2b_routerkey":
				writeJSON(w, http.StatusOK, api.Principal{Team: "default", KeyID: "bootstrap", Admin: true})
			case "e2b_team":
				writeJSON(w, http.StatusOK, api.Principal{Team: "t1", KeyID: "k1"})
			default:
				writeErr(w, http.StatusUnauthorized, "invalid API key")
			}
			return
		}
		n.mu.Lock()
		n.seen = append(n.seen, r.Header.Clone())
		n.mu.Unlock()
		if r.URL.Path == "/v2/sandboxes" {
			writeJSON(w, http.StatusOK, []any{})
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *uiNode) last() (http.Header, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.seen) == 0 {
		return nil, 0
	}
	return n.seen[len(n.seen)-1], len(n.seen)
}

type uiClient struct {
	t   *testing.T
	url string
}

func (c uiClient) do(method, path, body string, hdr map[string]string) (*http.Response, string) {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, c.url+path, rd)
	for k, v := range hdr {
		switch k {
		case "Cookie":
			req.AddCookie(&http.Cookie{Name: uiCookie, Value: v})
		case "Host":
			req.Host = v
		default:
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func (c uiClient) login(key string) (cookie, csrf string, info uiSessionInfo) {
	c.t.Helper()
	resp, b := c.do("POST", "/ui/session", `{"apiKey":"`+key+`"}`, nil)
	if resp.StatusCode != http.StatusCreated || json.Unmarshal([]byte(b), &info) != nil || info.CSRFToken == "" {
		c.t.Fatalf("POST /ui/session = %d %s", resp.StatusCode, b)
	}
	for _, ck := range resp.Cookies() {
		if ck.Name == uiCookie {
			if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.MaxAge != 3600 {
				c.t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, Path /, Max-Age 3600", ck)
			}
			if strings.Contains(ck.Value, key) || strings.Contains(b, key) {
				c.t.Errorf("the cookie or the answer shows the key")
			}
			return ck.Value, info.CSRFToken, info
		}
	}
	c.t.Fatal("no session cookie")
	return "", "", info
}

// TestUISessions: sign-in through a node's GET /principal, the sealed
// cookie taken by another replica (same cluster token) and refused by a
// router of another token, the credential sent on to the nodes and the
// cookie and CSRF token never, the CSRF and origin refusals reaching no
// node, expiry, the team keys only with SharedRecords, and the CSP.
func TestUISessions(t *testing.T) {
	n := newUINode(t)
	nodes := fakeNodes{cluster.Tag("a"): node("a", n.srv.URL, 10, 0)}
	now := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	page := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "page "+r.URL.Path) })
	mk := func(tok string, shared bool) uiClient {
		srv := httptest.NewServer(New(Options{Nodes: nodes, APIKey: "e2b_routerkey", Token: tok, Domain: "example.test",
			SharedRecords: shared, UI: page, UISessionTTL: time.Hour, Now: clock}))
		t.Cleanup(srv.Close)
		return uiClient{t: t, url: srv.URL}
	}
	a, b, plain, other := mk("tok", true), mk("tok", true), mk("tok", false), mk("other", true)

	resp, body := a.do("GET", "/ui/", "", nil)
	if resp.StatusCode != 200 || body != "page /" || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") ||
		resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Errorf("GET /ui/ = %d %q, CSP %q", resp.StatusCode, body, resp.Header.Get("Content-Security-Policy"))
	}
	if resp, body := a.do("POST", "/ui/session", `{"apiKey":"e2b_wrong"}`, nil); resp.StatusCode != 401 || len(resp.Cookies()) != 0 {
		t.Errorf("sign-in with a wrong key = %d %s, cookies %v", resp.StatusCode, body, resp.Cookies())
	}
	if resp, body := plain.do("POST", "/ui/session", `{"apiKey":"e2b_team"}`, nil); resp.StatusCode != 401 {
		t.Errorf("a team's key on a router without --shared-database = %d %s, want 401", resp.StatusCode, body)
	}
	if resp, body := a.do("POST", "/ui/session", `{"apiKey":"e2b_team"}`, map[string]string{"Origin": "http://evil.example"}); resp.StatusCode != 403 {
		t.Errorf("sign-in from another origin = %d %s, want 403", resp.StatusCode, body)
	}
	plain.login("e2b_routerkey")

	cookie, csrf, info := a.login("e2b_team")
	if info.Team != "t1" || info.KeyID != "k1" || info.Admin {
		t.Errorf("session info %+v, want team t1, key k1", info)
	}
	// Another replica takes the session and sends its credential on.
	_, before := n.last()
	resp, body = b.do("GET", "/v2/sandboxes", "", map[string]string{"Cookie": cookie, headerUICSRF: csrf})
	h, after := n.last()
	if resp.StatusCode != 200 || after != before+1 {
		t.Fatalf("a session through another replica = %d %s", resp.StatusCode, body)
	}
	if h.Get("X-API-Key") != "e2b_team" || h.Get(headerUICSRF) != "" || strings.Contains(h.Get("Cookie"), uiCookie) {
		t.Errorf("the node got X-API-Key %q, CSRF %q, Cookie %q: want the session's key alone", h.Get("X-API-Key"), h.Get(headerUICSRF), h.Get("Cookie"))
	}
	if resp, body := b.do("GET", "/ui/session", "", map[string]string{"Cookie": cookie}); resp.StatusCode != 200 || !strings.Contains(body, csrf) {
		t.Errorf("GET /ui/session through another replica = %d %s", resp.StatusCode, body)
	}
	// An access token's session reaches the nodes as a Bearer token.
	tokCookie, tokCSRF, _ := a.login("sk_e2b_token")
	a.do("GET", "/v2/sandboxes", "", map[string]string{"Cookie": tokCookie, headerUICSRF: tokCSRF})
	if h, _ := n.last(); h.Get("Authorization") != "Bearer sk_e2b_token" || h.Get("X-API-Key") != "" {
		t.Errorf("an access token's session reached the node with Authorization %q, X-API-Key %q", h.Get("Authorization"), h.Get("X-API-Key"))
	}
	// Refusals reach no node.
	for _, c := range []struct {
		what   string
		rt     uiClient
		hdr    map[string]string
		status int
	}{
		{"no CSRF token", a, map[string]string{"Cookie": cookie}, 403},
		{"a wrong CSRF token", a, map[string]string{"Cookie": cookie, headerUICSRF: strings.Repeat("0", 64)}, 403},
		{"another Origin", a, map[string]string{"Cookie": cookie, headerUICSRF: csrf, "Origin": "http://evil.example"}, 403},
		{"a cross-site fetch", a, map[string]string{"Cookie": cookie, headerUICSRF: csrf, "Sec-Fetch-Site": "same-site"}, 403},
		{"a router of another cluster token", other, map[string]string{"Cookie": cookie, headerUICSRF: csrf}, 401},
		{"a forged cookie", a, map[string]string{"Cookie": "x" + cookie[1:], headerUICSRF: csrf}, 401},
	} {
		_, before := n.last()
		resp, body := c.rt.do("POST", "/sandboxes", `{"templateID":"base"}`, c.hdr)
		if _, after := n.last(); resp.StatusCode != c.status || after != before {
			t.Errorf("%s = %d %s (node reached: %v), want %d", c.what, resp.StatusCode, body, after != before, c.status)
		}
	}
	// Sandbox traffic never carries the session to a node.
	a.do("GET", "/files", "", map[string]string{"Host": "49983-" + cluster.Tag("a") + "abcdefghijklmnopqr.example.test",
		"Cookie": cookie, headerUICSRF: csrf})
	if h, _ := n.last(); h.Get(headerUICSRF) != "" || strings.Contains(h.Get("Cookie"), uiCookie) {
		t.Errorf("sandbox traffic reached the node with the session: CSRF %q, Cookie %q", h.Get(headerUICSRF), h.Get("Cookie"))
	}
	// Sign-out clears the cookie.
	if resp, body := a.do("DELETE", "/ui/session", "", map[string]string{"Cookie": cookie, headerUICSRF: csrf}); resp.StatusCode != 204 ||
		len(resp.Cookies()) != 1 || resp.Cookies()[0].MaxAge >= 0 {
		t.Errorf("DELETE /ui/session = %d %s, cookies %v", resp.StatusCode, body, resp.Cookies())
	}
	// Expiry.
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	if resp, body := a.do("GET", "/v2/sandboxes", "", map[string]string{"Cookie": cookie, headerUICSRF: csrf}); resp.StatusCode != 401 {
		t.Errorf("an expired session = %d %s, want 401", resp.StatusCode, body)
	}
	if resp, body := a.do("GET", "/ui/session", "", map[string]string{"Cookie": cookie}); resp.StatusCode != 401 {
		t.Errorf("GET /ui/session of an expired session = %d %s, want 401", resp.StatusCode, body)
	}
}

// TestUIOff: without Options.UI, /ui answers 404 without reaching a
// node, and a session cookie authenticates nothing.
func TestUIOff(t *testing.T) {
	n := newUINode(t)
	nodes := fakeNodes{cluster.Tag("a"): node("a", n.srv.URL, 10, 0)}
	on := httptest.NewServer(New(Options{Nodes: nodes, APIKey: "e2b_routerkey", Token: "tok", UI: http.NotFoundHandler(), UISessionTTL: time.Hour}))
	defer on.Close()
	cookie, csrf, _ := uiClient{t: t, url: on.URL}.login("e2b_routerkey")
	srv := httptest.NewServer(New(Options{Nodes: nodes, APIKey: "e2b_routerkey", Token: "tok"}))
	defer srv.Close()
	c := uiClient{t: t, url: srv.URL}
	for _, p := range []string{"/ui/", "/ui/session"} {
		if resp, body := c.do("GET", p, "", map[string]string{"X-API-Key": "e2b_routerkey"}); resp.StatusCode != 404 {
			t.Errorf("GET %s without the dashboard = %d %s, want 404", p, resp.StatusCode, body)
		}
	}
	if resp, _ := c.do("POST", "/ui/session", `{"apiKey":"e2b_routerkey"}`, nil); resp.StatusCode != 404 {
		t.Errorf("sign-in without the dashboard = %d, want 404", resp.StatusCode)
	}
	if resp, body := c.do("GET", "/v2/sandboxes", "", map[string]string{"Cookie": cookie, headerUICSRF: csrf}); resp.StatusCode != 401 {
		t.Errorf("a session cookie on a router without the dashboard = %d %s, want 401", resp.StatusCode, body)
	}
	if _, seen := n.last(); seen != 0 {
		t.Errorf("%d requests reached the node", seen)
	}
}
