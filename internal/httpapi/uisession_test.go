package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// uiEnv is a handler with the dashboard on, the bootstrap key alone and a
// clock the test moves.
type uiEnv struct {
	srv *httptest.Server
	mu  sync.Mutex
	now time.Time
}

func newUIEnv(t *testing.T, ui bool) *uiEnv {
	e := &uiEnv{now: time.Unix(1_800_000_000, 0)}
	opts := Options{APIKey: testKey, UISessionTTL: time.Hour, Now: func() time.Time {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.now
	}}
	if ui {
		opts.UI = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "page "+r.URL.Path) })
	}
	e.srv = httptest.NewServer(New(opts))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *uiEnv) req(t *testing.T, method, path, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Cookie" {
			req.AddCookie(&http.Cookie{Name: uiCookie, Value: v})
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func (e *uiEnv) login(t *testing.T) (cookie, csrf string) {
	t.Helper()
	resp, b := e.req(t, "POST", "/ui/session", `{"apiKey":"`+testKey+`"}`, nil)
	var s uiSessionInfo
	if resp.StatusCode != http.StatusCreated || json.Unmarshal([]byte(b), &s) != nil || s.CSRFToken == "" {
		t.Fatalf("POST /ui/session = %d %s", resp.StatusCode, b)
	}
	for _, c := range resp.Cookies() {
		if c.Name == uiCookie {
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.MaxAge != 3600 || c.Path != "/" || c.Secure {
				t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, Max-Age 3600, Path /, not Secure on plain HTTP", c)
			}
			if strings.Contains(b, c.Value) || strings.Contains(b, testKey) {
				t.Errorf("the sign-in answer %s shows the cookie or the key", b)
			}
			return c.Value, s.CSRFToken
		}
	}
	t.Fatal("no session cookie")
	return "", ""
}

// TestUISession: a session authenticates a request only with its CSRF
// token and from its own origin, ends when signed out or expired, and the
// dashboard's answers carry the strict Content-Security-Policy.
func TestUISession(t *testing.T) {
	e := newUIEnv(t, true)
	cookie, csrf := e.login(t)
	// GET /approvals answers 501 here (no approvals) once authenticated.
	const authed = http.StatusNotImplemented
	host := strings.TrimPrefix(e.srv.URL, "http://")
	for _, tt := range []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"cookie and token", map[string]string{"Cookie": cookie, headerUICSRF: csrf}, authed},
		{"same origin", map[string]string{"Cookie": cookie, headerUICSRF: csrf, "Origin": e.srv.URL, "Sec-Fetch-Site": "same-origin"}, authed},
		{"no cookie", map[string]string{headerUICSRF: csrf}, http.StatusUnauthorized},
		{"no token", map[string]string{"Cookie": cookie}, http.StatusForbidden},
		{"wrong token", map[string]string{"Cookie": cookie, headerUICSRF: csrf[1:] + "0"}, http.StatusForbidden},
		{"another origin", map[string]string{"Cookie": cookie, headerUICSRF: csrf, "Origin": "http://evil.example"}, http.StatusForbidden},
		{"another port", map[string]string{"Cookie": cookie, headerUICSRF: csrf, "Origin": "http://" + strings.Split(host, ":")[0] + ":1"}, http.StatusForbidden},
		{"same-site, not same-origin", map[string]string{"Cookie": cookie, headerUICSRF: csrf, "Sec-Fetch-Site": "same-site"}, http.StatusForbidden},
		{"cross-site", map[string]string{"Cookie": cookie, headerUICSRF: csrf, "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"unknown cookie", map[string]string{"Cookie": strings.Repeat("0", 64), headerUICSRF: csrf}, http.StatusUnauthorized},
	} {
		for _, method := range []string{"GET", "POST"} {
			path := "/approvals"
			if method == "POST" {
				path = "/approvals/x"
			}
			if resp, b := e.req(t, method, path, "", tt.hdr); resp.StatusCode != tt.want {
				t.Errorf("%s: %s %s = %d %s, want %d", tt.name, method, path, resp.StatusCode, b, tt.want)
			}
		}
	}

	resp, b := e.req(t, "GET", "/ui/", "", nil)
	csp := resp.Header.Get("Content-Security-Policy")
	if resp.StatusCode != 200 || b != "page /" || !strings.Contains(csp, "script-src 'self';") || strings.Contains(csp, "unsafe-eval") ||
		!strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("GET /ui/ = %d %q, CSP %q", resp.StatusCode, b, csp)
	}
	if resp, b := e.req(t, "POST", "/ui/session", `{"apiKey":"e2b_`+strings.Repeat("0", 64)+`"}`, nil); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("sign-in with a wrong key = %d %s, cookies %v", resp.StatusCode, b, resp.Cookies())
	}
	if resp, b := e.req(t, "POST", "/ui/session", `{"apiKey":"`+testKey+`"}`, map[string]string{"Origin": "http://evil.example"}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("sign-in from another origin = %d %s", resp.StatusCode, b)
	}
	if resp, b := e.req(t, "GET", "/ui/session", "", map[string]string{"Cookie": cookie, "Sec-Fetch-Site": "same-site"}); resp.StatusCode != http.StatusForbidden || strings.Contains(b, csrf) {
		t.Errorf("GET /ui/session from another origin of the site = %d %s, want 403 without the token", resp.StatusCode, b)
	}
	if resp, b := e.req(t, "GET", "/ui/session", "", map[string]string{"Cookie": cookie, "Sec-Fetch-Site": "same-origin"}); resp.StatusCode != http.StatusOK || !strings.Contains(b, csrf) {
		t.Errorf("GET /ui/session = %d %s, want 200 with the token", resp.StatusCode, b)
	}

	// Signing out needs the token, then ends the session.
	if resp, _ := e.req(t, "DELETE", "/ui/session", "", map[string]string{"Cookie": cookie}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("sign-out without the token = %d, want 403", resp.StatusCode)
	}
	if resp, _ := e.req(t, "DELETE", "/ui/session", "", map[string]string{"Cookie": cookie, headerUICSRF: csrf}); resp.StatusCode != http.StatusNoContent {
		t.Errorf("sign-out = %d, want 204", resp.StatusCode)
	}
	if resp, _ := e.req(t, "GET", "/approvals", "", map[string]string{"Cookie": cookie, headerUICSRF: csrf}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a signed-out session = %d, want 401", resp.StatusCode)
	}

	// A session expires with its time to live.
	cookie, csrf = e.login(t)
	e.mu.Lock()
	e.now = e.now.Add(time.Hour - time.Second)
	e.mu.Unlock()
	if resp, _ := e.req(t, "GET", "/approvals", "", map[string]string{"Cookie": cookie, headerUICSRF: csrf}); resp.StatusCode != authed {
		t.Errorf("a session a second before its expiry = %d, want %d", resp.StatusCode, authed)
	}
	e.mu.Lock()
	e.now = e.now.Add(time.Second)
	e.mu.Unlock()
	if resp, _ := e.req(t, "GET", "/approvals", "", map[string]string{"Cookie": cookie, headerUICSRF: csrf}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("an expired session = %d, want 401", resp.StatusCode)
	}
	if resp, _ := e.req(t, "GET", "/ui/session", "", map[string]string{"Cookie": cookie}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /ui/session of an expired session = %d, want 401", resp.StatusCode)
	}
}

// TestUIOff: without Options.UI there is no dashboard, and a session
// cookie authenticates nothing.
func TestUIOff(t *testing.T) {
	e := newUIEnv(t, false)
	for _, p := range []string{"/ui/", "/ui/session"} {
		if resp, _ := e.req(t, "GET", p, "", nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", p, resp.StatusCode)
		}
	}
	if resp, _ := e.req(t, "POST", "/ui/session", `{"apiKey":"`+testKey+`"}`, nil); resp.StatusCode == http.StatusCreated {
		t.Error("POST /ui/session signed in with the dashboard off")
	}
}
