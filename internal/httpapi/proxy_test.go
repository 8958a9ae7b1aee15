package httpapi

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/sandbox"
)

func sbxHeaders(id, token string) []string {
	h := []string{api.HeaderSandboxID + ": " + id, api.HeaderSandboxPort + ": 49983"}
	if token != "" {
		h = append(h, api.HeaderAccessToken+": "+token)
	}
	return h
}

func wantProxyError(t *testing.T, what string, resp *http.Response, b []byte, id, msg string) {
	t.Helper()
	var pe api.ProxyError
	if err := json.Unmarshal(b, &pe); err != nil || resp.StatusCode != 502 || pe.Code != 502 || pe.SandboxID != id ||
		!strings.Contains(pe.Message, msg) {
		t.Errorf("%s = %d %s, want 502 {sandboxId:%q, message~%q, code:502}", what, resp.StatusCode, b, id, msg)
	}
}

func TestProxyRouting(t *testing.T) {
	e := newTestEnv(t)
	s := e.create(t, `{"templateID":"base"}`)
	id, tok := s.SandboxID, s.EnvdAccessToken

	// Health needs no token, by header or by host.
	for _, hdr := range [][]string{
		sbxHeaders(id, ""),
		{"Host: 49983-" + id + ".fence.test"},
		{"Host: 49983-" + id + ".fence.test:3000"},
		{"Host: 49983-" + id + ".localhost"},
	} {
		resp, b := e.do(t, "GET", "/health", "", hdr...)
		if resp.StatusCode != 204 {
			t.Errorf("GET /health %v = %d %s, want 204 from the agent", hdr, resp.StatusCode, b)
		}
	}

	// With the token, requests reach the agent, without the token header.
	resp, b := e.do(t, "POST", "/filesystem.Filesystem/ListDir?x=1", `{"path":"/"}`,
		append(sbxHeaders(id, tok), "Authorization: Basic cm9vdDo=", "Content-Type: application/json")...)
	var echo fake.Echo
	if err := json.Unmarshal(b, &echo); resp.StatusCode != 200 || err != nil {
		t.Fatalf("proxied POST = %d %s", resp.StatusCode, b)
	}
	if echo.SandboxID != id || echo.Path != "/filesystem.Filesystem/ListDir" || echo.Query != "x=1" || echo.Body != `{"path":"/"}` {
		t.Errorf("agent saw %+v", echo)
	}
	for k := range echo.Header {
		if strings.EqualFold(k, api.HeaderAccessToken) || strings.EqualFold(k, api.HeaderSandboxID) {
			t.Errorf("agent saw header %s: the proxy must strip it", k)
		}
	}
	if got := http.Header(echo.Header).Get("Authorization"); got != "Basic cm9vdDo=" {
		t.Errorf("agent saw Authorization %q, want the user's Basic header", got)
	}

	// Host routing works with the token too.
	resp, b = e.do(t, "GET", "/envs", "", "Host: 49983-"+id+".fence.test", api.HeaderAccessToken+": "+tok)
	if resp.StatusCode != 200 {
		t.Errorf("GET /envs by host = %d %s", resp.StatusCode, b)
	}
	// A control-plane-looking path with sandbox headers is sandbox traffic.
	resp, b = e.do(t, "GET", "/sandboxes", "", sbxHeaders(id, tok)...)
	if err := json.Unmarshal(b, &echo); err != nil || echo.Path != "/sandboxes" {
		t.Errorf("GET /sandboxes with sandbox headers = %d %s, want the agent's echo", resp.StatusCode, b)
	}
	// The API host itself is the control plane.
	resp, _ = e.do(t, "GET", "/v2/sandboxes", "", "Host: api.fence.test", "X-API-Key: "+testKey)
	if resp.StatusCode != 200 {
		t.Errorf("GET /v2/sandboxes on api.fence.test = %d, want 200", resp.StatusCode)
	}

	tests := []struct {
		name   string
		method string
		path   string
		hdr    []string
		status int
		msg    string
	}{
		{"no token", "POST", "/process.Process/Start", sbxHeaders(id, ""), 401, msgUnauthorized},
		{"wrong token", "POST", "/process.Process/Start", sbxHeaders(id, "nope"), 401, msgUnauthorized},
		{"other sandbox's token", "GET", "/envs", sbxHeaders(id, strings.Repeat("0", 64)), 401, msgUnauthorized},
		{"internal init", "POST", "/init", sbxHeaders(id, tok), 403, "internal"},
		{"internal init dotted", "POST", "/a/../INIT", sbxHeaders(id, tok), 403, "internal"},
		{"internal freeze", "POST", "/freeze/", sbxHeaders(id, tok), 403, "internal"},
		{"missing port", "GET", "/health", []string{api.HeaderSandboxID + ": " + id}, 400, "Missing header: E2b-Sandbox-Port"},
		{"bad port", "GET", "/health", []string{api.HeaderSandboxID + ": " + id, api.HeaderSandboxPort + ": x"}, 400, "invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := e.do(t, tt.method, tt.path, "", tt.hdr...)
			wantError(t, tt.method+" "+tt.path, resp, b, tt.status, tt.msg)
		})
	}

	// Other ports: 502 in the proxy's shape (the fake sandbox is attached
	// to no namespace: nothing listens behind its fence).
	resp, b = e.do(t, "GET", "/", "", api.HeaderSandboxID+": "+id, api.HeaderSandboxPort+": 8000")
	wantProxyError(t, "GET port 8000", resp, b, id, "port is not open: 8000")
	resp, b = e.do(t, "GET", "/", "", "Host: 8000-"+id+".fence.test")
	wantProxyError(t, "GET port 8000 by host", resp, b, id, "port is not open: 8000")

	// Unknown sandboxes and junk IDs.
	for _, bad := range []string{"unknown", "..", "a%2fb", "UPPER"} {
		resp, b = e.do(t, "GET", "/health", "", sbxHeaders(bad, "")...)
		wantProxyError(t, "GET /health of "+bad, resp, b, bad, "The sandbox was not found")
	}
}

func TestProxySignatures(t *testing.T) {
	e := newTestEnv(t)
	s := e.create(t, `{"templateID":"base"}`)
	id, tok := s.SandboxID, s.EnvdAccessToken
	future := time.Now().Add(time.Hour).Unix()
	past := time.Now().Add(-time.Hour).Unix()
	filesURL := func(path, op, user string, exp *int64, sig string) string {
		q := url.Values{"path": {path}}
		if user != "" {
			q.Set("username", user)
		}
		if sig == "" {
			sig = fileSignature(path, op, user, tok, exp)
		}
		if sig != "-" {
			q.Set("signature", sig)
		}
		if exp != nil {
			q.Set("signature_expiration", strconv.FormatInt(*exp, 10))
		}
		return "/files?" + q.Encode()
	}
	tests := []struct {
		name, method, url string
		hdr               []string
		status            int
		msg               string
	}{
		{"read signed", "GET", filesURL("a.txt", "read", "", nil, ""), nil, 200, ""},
		{"read signed user", "GET", filesURL("/tmp/a", "read", "root", nil, ""), nil, 200, ""},
		{"write signed with expiry", "POST", filesURL("a.txt", "write", "user", &future, ""), nil, 200, ""},
		{"token instead", "GET", "/files?path=a.txt", []string{api.HeaderAccessToken + ": " + tok}, 200, ""},
		{"missing", "GET", filesURL("a.txt", "read", "", nil, "-"), nil, 401, "missing signature query parameter"},
		{"invalid", "GET", filesURL("a.txt", "read", "", nil, "v1_bogus"), nil, 401, "invalid signature"},
		{"wrong operation", "POST", filesURL("a.txt", "read", "", nil, ""), nil, 401, "invalid signature"},
		{"expired", "GET", filesURL("a.txt", "read", "", &past, ""), nil, 401, "signature is already expired"},
		{"wrong token wins over signature", "GET", filesURL("a.txt", "read", "", nil, ""), []string{api.HeaderAccessToken + ": x"}, 401, msgUnauthorized},
		{"signature does not open other routes", "POST", "/process.Process/List?signature=" + fileSignature("", "write", "", tok, nil), nil, 401, msgUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := e.do(t, tt.method, tt.url, "", append(sbxHeaders(id, ""), tt.hdr...)...)
			if tt.status == 200 {
				if resp.StatusCode != 200 {
					t.Errorf("%s %s = %d %s, want 200", tt.method, tt.url, resp.StatusCode, b)
				}
				return
			}
			wantError(t, tt.method+" "+tt.url, resp, b, tt.status, tt.msg)
			if tt.msg != msgUnauthorized {
				var e api.Error
				json.Unmarshal(b, &e)
				if e.Message != tt.msg {
					t.Errorf("message = %q, want exactly %q", e.Message, tt.msg)
				}
			}
		})
	}
}

func TestFileSignatureVector(t *testing.T) {
	// sha256("a.txt:read::tok") in unpadded standard base64, as the SDK computes it.
	got := fileSignature("a.txt", "read", "", "tok", nil)
	if !strings.HasPrefix(got, "v1_") || strings.HasSuffix(got, "=") || len(got) != 3+43 {
		t.Errorf("fileSignature() = %q, want v1_ + 43 unpadded base64 chars", got)
	}
	exp := int64(1700000000)
	if fileSignature("a.txt", "read", "", "tok", &exp) == got {
		t.Errorf("fileSignature with expiration = without")
	}
}

func TestProxyAfterKill(t *testing.T) {
	e := newTestEnv(t)
	s := e.create(t, `{"templateID":"base"}`)
	resp, _ := e.api(t, "DELETE", "/sandboxes/"+s.SandboxID, "")
	if resp.StatusCode != 204 {
		t.Fatalf("DELETE = %d", resp.StatusCode)
	}
	resp, b := e.do(t, "GET", "/health", "", sbxHeaders(s.SandboxID, "")...)
	wantProxyError(t, "GET /health after kill", resp, b, s.SandboxID, "The sandbox was not found")
	resp, b = e.do(t, "GET", "/health", "", "Host: 49983-"+s.SandboxID+".fence.test")
	wantProxyError(t, "GET /health by host after kill", resp, b, s.SandboxID, "The sandbox was not found")
}

// TestStreamAbortOnKill checks that a stream in flight when its sandbox is
// killed breaks (the client sees an error), instead of ending cleanly.
func TestStreamAbortOnKill(t *testing.T) {
	t.Run("connections close", func(t *testing.T) { testStreamAbortOnKill(t, fake.Options{}) })
	// The agent's connections outlive the kill: only watching Done aborts.
	t.Run("connections linger", func(t *testing.T) { testStreamAbortOnKill(t, fake.Options{LingerOnKill: true}) })
}

func testStreamAbortOnKill(t *testing.T, fo fake.Options) {
	fo.StreamInterval = time.Millisecond
	e := newTestEnv(t, fo)
	s := e.create(t, `{"templateID":"base"}`)
	// A hang guard, not a timing assertion: a stream the proxy fails to
	// abort would otherwise run forever.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/process.Process/Start",
		strings.NewReader("\x00\x00\x00\x00\x02{}"))
	for _, h := range sbxHeaders(s.SandboxID, s.EnvdAccessToken) {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/connect+json")
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("Start = %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	first, err := readEnvelope(br)
	if err != nil || !strings.Contains(string(first), "start") {
		t.Fatalf("first envelope = %q, %v; want the start event", first, err)
	}
	if _, err := readEnvelope(br); err != nil {
		t.Fatalf("keepalive envelope: %v", err)
	}
	if err := e.m.Kill(t.Context(), s.SandboxID); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := readEnvelope(br)
		if err == nil {
			continue
		}
		if err == io.EOF {
			t.Errorf("stream ended cleanly after kill; want an aborted connection")
		}
		if ctx.Err() != nil {
			t.Errorf("stream still running after kill; want an aborted connection")
		}
		break
	}
}

// TestStreamAbortOnAgentDeath: the same when the sandbox dies on its own.
func TestStreamAbortOnAgentDeath(t *testing.T) {
	e := newTestEnv(t)
	s := e.create(t, `{"templateID":"base"}`)
	req, _ := http.NewRequestWithContext(t.Context(), "POST", e.srv.URL+"/process.Process/Start", strings.NewReader("x"))
	for _, h := range sbxHeaders(s.SandboxID, s.EnvdAccessToken) {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := readEnvelope(br); err != nil {
		t.Fatal(err)
	}
	fs, _ := e.host.Sandbox(s.SandboxID)
	fs.Crash()
	for {
		_, err := readEnvelope(br)
		if err == nil {
			continue
		}
		if err == io.EOF {
			t.Errorf("stream ended cleanly after the agent died; want an aborted connection")
		}
		break
	}
}

// TestSignedFilesWithoutRouting: a signed URL that names no sandbox (the
// SDKs' uploadUrl under E2B_SANDBOX_URL) finds its sandbox by signature.
func TestSignedFilesWithoutRouting(t *testing.T) {
	e := newTestEnv(t)
	e.create(t, `{"templateID":"base"}`) // a decoy
	s := e.create(t, `{"templateID":"base"}`)
	past := time.Now().Add(-time.Hour).Unix()
	tests := []struct {
		name, method, url string
		status            int
		msg               string
	}{
		{"read", "GET", "/files?path=a.txt&signature=" + url.QueryEscape(fileSignature("a.txt", "read", "", s.EnvdAccessToken, nil)), 200, ""},
		{"write", "POST", "/files?path=a.txt&username=user&signature=" + url.QueryEscape(fileSignature("a.txt", "write", "user", s.EnvdAccessToken, nil)), 200, ""},
		{"invalid", "GET", "/files?path=a.txt&signature=v1_nope", 401, "invalid signature"},
		{"expired", "GET", fmt.Sprintf("/files?path=a.txt&signature=%s&signature_expiration=%d",
			url.QueryEscape(fileSignature("a.txt", "read", "", s.EnvdAccessToken, &past)), past), 401, "signature is already expired"},
		{"wrong method", "PUT", "/files?path=a.txt&signature=v1_x", 405, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := e.do(t, tt.method, tt.url, "")
			if tt.status == 200 {
				var echo fake.Echo
				if err := json.Unmarshal(b, &echo); resp.StatusCode != 200 || err != nil || echo.SandboxID != s.SandboxID {
					t.Errorf("%s %s = %d %s, want 200 from sandbox %s", tt.method, tt.url, resp.StatusCode, b, s.SandboxID)
				}
				return
			}
			wantError(t, tt.method+" "+tt.url, resp, b, tt.status, tt.msg)
		})
	}
	// Without a signature /files is a control-plane path, which has no such route.
	resp, b := e.api(t, "GET", "/files?path=a.txt", "")
	wantError(t, "GET /files unsigned", resp, b, 404, "")
}

// TestSignatureProbe: with HeaderSignatureProbe a signed request only asks
// whether this daemon holds its sandbox: 204 without reaching the agent,
// and the same refusals as the request itself.
func TestSignatureProbe(t *testing.T) {
	e := newTestEnv(t)
	s := e.create(t, `{"templateID":"base"}`)
	probe := api.HeaderSignatureProbe + ": 1"
	good := "/files?path=a.txt&username=user&signature=" + url.QueryEscape(fileSignature("a.txt", "write", "user", s.EnvdAccessToken, nil))
	if resp, b := e.do(t, "POST", good, "", probe); resp.StatusCode != http.StatusNoContent || len(b) != 0 {
		t.Errorf("probe of a good signature = %d %s, want 204 and no body (the agent not reached)", resp.StatusCode, b)
	}
	resp, b := e.do(t, "POST", "/files?path=a.txt&signature=v1_nope", "", probe)
	wantError(t, "probe of a bad signature", resp, b, 401, "invalid signature")
	// A read signature does not probe as a write.
	read := "/files?path=a.txt&username=user&signature=" + url.QueryEscape(fileSignature("a.txt", "read", "user", s.EnvdAccessToken, nil))
	resp, b = e.do(t, "POST", read, "", probe)
	wantError(t, "probe of a read signature as a write", resp, b, 401, "invalid signature")
}

// TestProxyStripsCredentials: a request to the agent carries none of
// fence's credentials (API key, access token, traffic token, a Bearer API
// key), only the user of its Basic auth, and a signed URL loses its
// signature on the way in. The agent is inside the sandbox: untrusted.
func TestProxyStripsCredentials(t *testing.T) {
	e := newTestEnv(t)
	s := e.create(t, `{"templateID":"base"}`)
	id, tok := s.SandboxID, s.EnvdAccessToken
	secret := "Basic " + base64.StdEncoding.EncodeToString([]byte("root:hunter2"))
	resp, b := e.do(t, "POST", "/filesystem.Filesystem/ListDir", `{}`, append(sbxHeaders(id, tok),
		"X-API-Key: "+testKey, api.HeaderTrafficToken+": traffic-secret", "Authorization: "+secret)...)
	var echo fake.Echo
	if err := json.Unmarshal(b, &echo); resp.StatusCode != 200 || err != nil {
		t.Fatalf("proxied POST = %d %s", resp.StatusCode, b)
	}
	hdr := http.Header(echo.Header)
	for _, k := range []string{"X-API-Key", api.HeaderAccessToken, api.HeaderTrafficToken, api.HeaderSandboxID, api.HeaderSandboxPort} {
		if v := hdr.Values(k); len(v) > 0 {
			t.Errorf("agent got %s: %q", k, v)
		}
	}
	if got, want := hdr.Values("Authorization"), []string{"Basic cm9vdDo="}; len(got) != 1 || got[0] != want[0] {
		t.Errorf("agent got Authorization %q, want %q (the user alone)", got, want)
	}
	for _, v := range []string{testKey, tok, "traffic-secret", "hunter2"} {
		if strings.Contains(string(b), v) {
			t.Errorf("the agent saw the secret %q: %s", v, b)
		}
	}

	// Authorization that is not Basic auth naming a user is refused, not
	// forwarded.
	for _, v := range []string{"Bearer " + testKey, "Basic !!!", "Digest x"} {
		resp, b := e.do(t, "GET", "/envs", "", append(sbxHeaders(id, tok), "Authorization: "+v)...)
		wantError(t, "Authorization: "+v, resp, b, 401, "Basic auth")
	}

	// A signed /files URL reaches the agent without its signature.
	q := url.Values{"path": {"a.txt"}, "signature": {fileSignature("a.txt", "read", "", tok, nil)}}
	for _, hdr := range [][]string{sbxHeaders(id, ""), nil} {
		resp, b = e.do(t, "GET", "/files?"+q.Encode(), "", hdr...)
		if err := json.Unmarshal(b, &echo); resp.StatusCode != 200 || err != nil {
			t.Fatalf("signed GET /files = %d %s", resp.StatusCode, b)
		}
		if echo.Query != "path=a.txt" {
			t.Errorf("agent got query %q, want path=a.txt alone", echo.Query)
		}
	}
}

func TestStripCredentials(t *testing.T) {
	h := &handler{apiKey: []byte(testKey)}
	tests := []struct {
		name string
		in   http.Header
		want http.Header
	}{
		{"fence headers", http.Header{"X-Api-Key": {testKey}, "X-Access-Token": {"t"}, "E2b-Traffic-Access-Token": {"x"},
			"E2b-Sandbox-Id": {"s"}, "E2b-Sandbox-Port": {"80"}, "Accept": {"*/*"}}, http.Header{"Accept": {"*/*"}}},
		{"bearer API key", http.Header{"Authorization": {"bearer " + testKey}}, http.Header{}},
		{"admin token and team", http.Header{"X-Admin-Token": {testKey}, "X-Team-Id": {"t"}}, http.Header{}},
		{"a team's bearer key", http.Header{"Authorization": {"Bearer e2b_00ff"}}, http.Header{}},
		{"a bearer access token", http.Header{"Authorization": {"Bearer sk_e2b_00ff"}}, http.Header{}},
		{"the app's own bearer", http.Header{"Authorization": {"Bearer app-token"}}, http.Header{"Authorization": {"Bearer app-token"}}},
		{"the app's basic", http.Header{"Authorization": {"Basic dTpw"}}, http.Header{"Authorization": {"Basic dTpw"}}},
		{"the dashboard's session", http.Header{"Cookie": {"a=1; " + uiCookie + "=s3cret; b=2"}, "X-Fence-Csrf": {"t"}}, http.Header{"Cookie": {"a=1; b=2"}}},
		{"the dashboard's session alone", http.Header{"Cookie": {uiCookie + "=s3cret"}}, http.Header{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.in.Clone()
			h.stripCredentials(got)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("stripCredentials(%v) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// countingManager counts the calls that find a sandbox for a request, and
// the tokens a signature is checked against.
type countingManager struct {
	Manager
	lists, scans, tokens atomic.Int64
	mu                   sync.Mutex
	looked               map[string]bool // IDs looked up
}

func (c *countingManager) Live(id string) (*sandbox.Sandbox, isolation.Sandbox, error) {
	c.mu.Lock()
	c.looked[id] = true
	c.mu.Unlock()
	return c.Manager.Live(id)
}

func (c *countingManager) lookups() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(len(c.looked))
}

func (c *countingManager) List(ctx context.Context, f sandbox.ListFilter) ([]*sandbox.Sandbox, error) {
	c.lists.Add(1)
	return c.Manager.List(ctx, f)
}

func (c *countingManager) MatchToken(match func(string) bool) (string, bool) {
	c.scans.Add(1)
	return c.Manager.MatchToken(func(tok string) bool {
		c.tokens.Add(1)
		return match(tok)
	})
}

func (c *countingManager) reset() {
	c.mu.Lock()
	c.looked = map[string]bool{}
	c.mu.Unlock()
	c.lists.Store(0)
	c.scans.Store(0)
	c.tokens.Store(0)
}

// TestSignedFilesIndex: a signed URL is served after looking at one
// sandbox when it names it (header or host) or was seen before; a new
// signature that names none is matched in memory, never by listing the
// store; bad and malformed signatures are refused, malformed ones without
// looking at any sandbox.
func TestSignedFilesIndex(t *testing.T) {
	const n = 200
	e := newTestEnv(t)
	cm := &countingManager{Manager: e.m, looked: map[string]bool{}}
	hd := New(Options{Manager: cm, Pauses: e.m.Pauses(), Network: e.net, APIKey: testKey, Domain: "fence.test"})
	srv := httptest.NewServer(hd)
	t.Cleanup(srv.Close)
	e.srv = srv
	var last api.Sandbox
	for range n {
		last = e.create(t, `{"templateID":"base"}`)
	}
	// Each create warms its agent's connection in the background, which
	// looks the sandbox up: done before anything is counted.
	hd.(*handler).warming.Wait()
	signed := func(path string) string {
		return "/files?" + url.Values{"path": {path}, "signature": {fileSignature(path, "read", "", last.EnvdAccessToken, nil)}}.Encode()
	}
	type counts struct{ lookups, lists, scans, tokens int64 }
	get := func(name, u string, wantStatus int, hdr ...string) counts {
		t.Helper()
		cm.reset()
		resp, b := e.do(t, "GET", u, "", hdr...)
		if resp.StatusCode != wantStatus {
			t.Fatalf("%s: GET %s = %d %s, want %d", name, u, resp.StatusCode, b, wantStatus)
		}
		if wantStatus == 200 {
			var echo fake.Echo
			if json.Unmarshal(b, &echo); echo.SandboxID != last.SandboxID {
				t.Fatalf("%s: served by %q, want %s", name, echo.SandboxID, last.SandboxID)
			}
		}
		c := counts{cm.lookups(), cm.lists.Load(), cm.scans.Load(), cm.tokens.Load()}
		t.Logf("%s: %d sandboxes looked up, %d store lists, %d scans, %d tokens checked", name, c.lookups, c.lists, c.scans, c.tokens)
		return c
	}
	one := counts{lookups: 1}
	if c := get("by header", signed("a"), 200, sbxHeaders(last.SandboxID, "")...); c != one {
		t.Errorf("by header: %+v, want %+v", c, one)
	}
	if c := get("by host", signed("a"), 200, "Host: 49983-"+last.SandboxID+".fence.test"); c != one {
		t.Errorf("by host: %+v, want %+v", c, one)
	}
	// A new signature naming no sandbox: matched in memory, never listed.
	if c := get("new, no sandbox named", signed("b"), 200); c.lists != 0 || c.scans != 1 || c.tokens > n {
		t.Errorf("new signature: %+v, want no store list, one scan of at most %d tokens", c, n)
	}
	// The same URL again: one sandbox.
	if c := get("seen before", signed("b"), 200); c != one {
		t.Errorf("seen before: %+v, want %+v", c, one)
	}
	// Malformed: refused without looking.
	for _, sig := range []string{"v1_nope", "v2_" + strings.Repeat("A", 43), "v1_" + strings.Repeat("*", 43)} {
		if c := get("malformed "+sig, "/files?path=a&signature="+url.QueryEscape(sig), 401); c != (counts{}) {
			t.Errorf("malformed %q: %+v, want nothing looked at", sig, c)
		}
	}
	// Well-formed but wrong: refused after the scan, and not indexed.
	bad := "/files?" + url.Values{"path": {"a"}, "signature": {fileSignature("a", "read", "", "not-a-token", nil)}}.Encode()
	for range 2 {
		resp, b := e.do(t, "GET", bad, "")
		wantError(t, "bad signature", resp, b, 401, "invalid signature")
	}
	// A signature indexed for a sandbox that is gone is refused.
	if resp, b := e.api(t, "DELETE", "/sandboxes/"+last.SandboxID, ""); resp.StatusCode != 204 {
		t.Fatalf("DELETE = %d %s", resp.StatusCode, b)
	}
	resp, b := e.do(t, "GET", signed("b"), "")
	wantError(t, "indexed signature of a killed sandbox", resp, b, 401, "invalid signature")
}

// BenchmarkSignatureScan1000 measures what a new signature that names no
// sandbox costs with 1,000 sandboxes running: one check per token.
func BenchmarkSignatureScan1000(b *testing.B) {
	tokens := make([]string, 1000)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("%064x", i)
	}
	q := url.Values{"path": {"/home/user/data.csv"}, "signature": {fileSignature("/home/user/data.csv", "read", "", "none", nil)}}
	now := time.Now()
	for b.Loop() {
		sr, err := parseSigned(q, "read")
		if err != nil {
			b.Fatal(err)
		}
		for _, tok := range tokens {
			if sr.check(tok, now) == nil {
				b.Fatal("matched")
			}
		}
	}
}

// TestCreateWarmsTheAgentConnection: the proxy's connection to a new
// sandbox's agent is made beside the create's answer, so the sandbox's
// first command reuses it instead of dialing in its own round trip.
func TestCreateWarmsTheAgentConnection(t *testing.T) {
	warmed := make(chan string, 1)
	agentWarmed = func(id string) { warmed <- id }
	defer func() { agentWarmed = nil }()
	e := newTestEnv(t)
	s := e.create(t, `{"templateID":"base"}`)
	fs, ok := e.host.Sandbox(s.SandboxID)
	if !ok {
		t.Fatal("the fake host does not know the sandbox")
	}
	select {
	case id := <-warmed:
		if id != s.SandboxID {
			t.Fatalf("warmed %s, want %s", id, s.SandboxID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no connection to the agent was made after the create")
	}
	if n := fs.Dials(); n != 1 {
		t.Fatalf("%d connections to the agent after the create, want 1", n)
	}
	resp, b := e.do(t, "POST", "/filesystem.Filesystem/ListDir", `{"path":"/"}`,
		append(sbxHeaders(s.SandboxID, s.EnvdAccessToken), "Content-Type: application/json")...)
	if resp.StatusCode != 200 {
		t.Fatalf("first request = %d %s", resp.StatusCode, b)
	}
	if n := fs.Dials(); n != 1 {
		t.Errorf("%d connections to the agent after the create and one request, want 1 (the one made at create)", n)
	}
}

// TestFirstRequestTakesTheWarmConnection: a sandbox's first command that
// arrives while the warm-up of the proxy's connection to its agent is
// still in flight waits for that connection rather than dialing another.
func TestFirstRequestTakesTheWarmConnection(t *testing.T) {
	hold := make(chan struct{})
	var holdOnce sync.Once
	release := func() { holdOnce.Do(func() { close(hold) }) }
	defer release()
	warmed := make(chan string, 1)
	waiting := make(chan string, 1)
	warmWaiting = func(id string) { waiting <- id }
	agentWarmed = func(id string) { warmed <- id }
	defer func() { warmWaiting, agentWarmed = nil, nil }()
	// The agent holds its answer to the warm-up's health check.
	e := newTestEnv(t, fake.Options{HealthHook: func() { <-hold }})
	s := e.create(t, `{"templateID":"base"}`)
	fs, ok := e.host.Sandbox(s.SandboxID)
	if !ok {
		t.Fatal("the fake host does not know the sandbox")
	}
	type answer struct {
		status int
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		req, err := http.NewRequestWithContext(t.Context(), "POST", e.srv.URL+"/filesystem.Filesystem/ListDir", strings.NewReader(`{"path":"/"}`))
		if err != nil {
			answered <- answer{err: err}
			return
		}
		for _, h := range append(sbxHeaders(s.SandboxID, s.EnvdAccessToken), "Content-Type: application/json") {
			k, v, _ := strings.Cut(h, ": ")
			req.Header.Set(k, v)
		}
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered <- answer{status: resp.StatusCode}
	}()
	var got answer
	select {
	case id := <-waiting:
		if id != s.SandboxID {
			t.Fatalf("the first request waited for %s's warm-up, want %s", id, s.SandboxID)
		}
		release()
		got = <-answered
	case got = <-answered:
		// Served beside the warm-up, on a connection of its own.
		release()
	case <-time.After(10 * time.Second):
		t.Fatal("the first request neither waited for the warm-up nor was answered")
	}
	if got.err != nil || got.status != 200 {
		t.Fatalf("first request: %d %v", got.status, got.err)
	}
	select {
	case <-warmed:
	case <-time.After(10 * time.Second):
		t.Fatal("the warm-up did not finish")
	}
	if n := fs.Dials(); n != 1 {
		t.Errorf("%d connections to the agent after the create and a first request sent during the warm-up, want 1", n)
	}
}
