package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/downloads"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
	"github.com/fencesandbox/fence/internal/secrets"
	"github.com/fencesandbox/fence/internal/store"
)

const testKey = "e2b_0123456789abcdef"

type templates map[string]string

func (ts templates) Resolve(name string) (string, error) {
	if p, ok := ts[name]; ok {
		return p, nil
	}
	return "", fmt.Errorf("template %q: %w", name, api.ErrNotFound)
}

type testEnv struct {
	srv  *httptest.Server
	m    *sandbox.Manager
	net  *fences.Set
	host *fake.Host
	st   *store.Store
	sec  *secrets.Store
	dl   *downloads.Log
}

func newTestEnv(t *testing.T, fopts ...fake.Options) *testEnv {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	host := fake.NewHost()
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	fo := fake.Options{StreamInterval: time.Millisecond}
	if len(fopts) > 0 {
		fo = fopts[0]
	}
	fo.Host = host
	nets := fences.New(fences.Options{Logger: log})
	m, err := sandbox.New(sandbox.Options{
		Network:   nets,
		Backend:   fake.New(fo),
		Store:     st,
		Templates: templates{"base": "/rootfs/base"},
		Logger:    log,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	sec, err := secrets.Open(secrets.Options{DB: st, KeyPath: filepath.Join(t.TempDir(), "secrets.key")})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := downloads.Open(t.Context(), st, downloads.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Options{Manager: m, Pauses: m.Pauses(), Network: nets, APIKey: testKey, Domain: "fence.test", Logger: log,
		Secrets: sec, Downloads: dl, Usage: m.Meter(), Identity: st}))
	t.Cleanup(func() {
		srv.Close()
		m.Shutdown(context.Background())
		host.Close()
		st.Close()
	})
	return &testEnv{srv: srv, m: m, net: nets, host: host, st: st, sec: sec, dl: dl}
}

// do sends a request; hdr entries are "Name: value". A nil body sends none.
func (e *testEnv) do(t *testing.T, method, path, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, e.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ": ")
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// api sends an authenticated control-plane request.
func (e *testEnv) api(t *testing.T, method, path, body string) (*http.Response, []byte) {
	t.Helper()
	return e.do(t, method, path, body, "X-API-Key: "+testKey)
}

func (e *testEnv) create(t *testing.T, body string) api.Sandbox {
	t.Helper()
	resp, b := e.api(t, "POST", "/v2/sandboxes", body)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v2/sandboxes = %d %s, want 201", resp.StatusCode, b)
	}
	var s api.Sandbox
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func wantError(t *testing.T, what string, resp *http.Response, body []byte, status int, msg string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Errorf("%s = %d %s, want %d", what, resp.StatusCode, body, status)
		return
	}
	var e api.Error
	if err := json.Unmarshal(body, &e); err != nil || e.Code != status {
		t.Errorf("%s body = %s, want {\"code\":%d,...}", what, body, status)
		return
	}
	if msg != "" && !strings.Contains(e.Message, msg) {
		t.Errorf("%s message = %q, want it to contain %q", what, e.Message, msg)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s Content-Type = %q, want application/json", what, ct)
	}
}

func TestHealthAndAuth(t *testing.T) {
	e := newTestEnv(t)
	resp, b := e.do(t, "GET", "/health", "")
	if resp.StatusCode != 200 || !json.Valid(b) {
		t.Errorf("GET /health = %d %s, want 200 JSON", resp.StatusCode, b)
	}
	resp, b = e.do(t, "GET", "/v2/sandboxes", "")
	wantError(t, "GET /v2/sandboxes without key", resp, b, 401, "missing API key")
	resp, b = e.do(t, "GET", "/v2/sandboxes", "", "X-API-Key: e2b_wrong")
	wantError(t, "GET /v2/sandboxes with wrong key", resp, b, 401, "invalid API key")
	resp, b = e.do(t, "GET", "/v2/sandboxes", "", "x-api-key: "+testKey) // header names are case-insensitive
	if resp.StatusCode != 200 {
		t.Errorf("GET /v2/sandboxes with key = %d %s", resp.StatusCode, b)
	}
	resp, b = e.do(t, "DELETE", "/sandboxes/abc", "")
	wantError(t, "DELETE without key", resp, b, 401, "")
}

func TestEmptyAPIKeyFailsClosed(t *testing.T) {
	e := newTestEnv(t)
	h := New(Options{Manager: e.m, Pauses: e.m.Pauses(), Network: e.net})
	for _, key := range []string{"", "x"} {
		req := httptest.NewRequest("GET", "/v2/sandboxes", nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 401 {
			t.Errorf("GET /v2/sandboxes with APIKey unset and key %q = %d, want 401", key, rec.Code)
		}
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	e := newTestEnv(t)
	resp, b := e.api(t, "GET", "/nope", "")
	wantError(t, "GET /nope", resp, b, 404, "no route")
	resp, b = e.api(t, "PATCH", "/sandboxes", "")
	wantError(t, "PATCH /sandboxes", resp, b, 405, "not allowed")
	if resp.Header.Get("Allow") == "" {
		t.Errorf("PATCH /sandboxes: no Allow header")
	}
	resp, b = e.do(t, "GET", "/nope", "")
	wantError(t, "GET /nope unauthenticated", resp, b, 404, "")
}

func TestCreate(t *testing.T) {
	e := newTestEnv(t)
	for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
		t.Run(path, func(t *testing.T) {
			resp, b := e.api(t, "POST", path, `{"templateID":"base","metadata":{"k":"v w"},"envVars":{"FOO":"bar"},"secure":true,"allow_internet_access":true,"autoResume":{"enabled":false}}`)
			if resp.StatusCode != 201 {
				t.Fatalf("POST %s = %d %s, want 201", path, resp.StatusCode, b)
			}
			var raw map[string]any
			json.Unmarshal(b, &raw)
			for _, k := range []string{"sandboxID", "templateID", "clientID", "envdVersion", "envdAccessToken", "domain", "trafficAccessToken"} {
				if _, ok := raw[k]; !ok {
					t.Errorf("POST %s body %s lacks %q", path, b, k)
				}
			}
			if raw["clientID"] != api.ClientID || raw["envdVersion"] != api.EnvdVersion || raw["domain"] != "fence.test" ||
				raw["templateID"] != "base" || raw["trafficAccessToken"] != nil {
				t.Errorf("POST %s body = %s", path, b)
			}
			id := raw["sandboxID"].(string)
			s, err := e.m.Get(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.EndAt.Sub(s.StartedAt); got != 5*time.Minute {
				t.Errorf("timeout absent: lifetime %v, want daemon default 5m", got)
			}
			fs, _ := e.host.Sandbox(id)
			if fs.Spec().Agent.EnvVars["FOO"] != "bar" {
				t.Errorf("envVars not handed to the backend: %+v", fs.Spec().Agent)
			}
		})
	}
	tests := []struct {
		name, body string
		status     int
		msg        string
	}{
		{"malformed", `{"templateID":`, 400, "malformed JSON"},
		{"not an object", `[1,2]`, 400, "malformed JSON"},
		{"empty", ``, 400, "empty"},
		{"no template", `{}`, 400, "templateID is required"},
		{"unknown template", `{"templateID":"nope"}`, 404, "nope"},
		{"zero timeout", `{"templateID":"base","timeout":0}`, 400, "timeout"},
		{"huge timeout", `{"templateID":"base","timeout":2000000000}`, 400, "timeout"},
		{"negative cpu", `{"templateID":"base","cpuCount":-1}`, 400, "cpuCount"},
		{"autoPauseMemory without autoPause", `{"templateID":"base","autoPauseMemory":false}`, 400, "autoPauseMemory"},
		// The fake backend keeps no layers: a filesystem-only pause is not
		// available (the native backend's is tested in integration).
		{"filesystem-only autoPause", `{"templateID":"base","autoPause":true,"autoPauseMemory":false}`, 501, "without memory"},
		{"filesystem-only autoPause with autoResume", `{"templateID":"base","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`, 400, "autoResume"},
		{"oversized", `{"templateID":"base","metadata":{"k":"` + strings.Repeat("x", 2<<20) + `"}}`, 413, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := e.api(t, "POST", "/v2/sandboxes", tt.body)
			wantError(t, "POST /v2/sandboxes "+tt.name, resp, b, tt.status, tt.msg)
		})
	}
	if got := len(e.host.Running()); got != 2 {
		t.Errorf("sandboxes running = %d, want 2 (bad requests create nothing)", got)
	}
}

func TestSandboxRoutes(t *testing.T) {
	e := newTestEnv(t)
	s := e.create(t, `{"templateID":"base","timeout":60,"metadata":{"a":"b"}}`)
	id := s.SandboxID

	resp, b := e.api(t, "GET", "/sandboxes/"+id, "")
	if resp.StatusCode != 200 {
		t.Fatalf("GET /sandboxes/%s = %d %s", id, resp.StatusCode, b)
	}
	var d api.SandboxDetail
	json.Unmarshal(b, &d)
	if d.SandboxID != id || d.State != "running" || d.ClientID != api.ClientID || d.EnvdAccessToken != s.EnvdAccessToken ||
		d.Metadata["a"] != "b" || d.CPUCount != 1 || d.MemoryMB != 512 || d.Domain == nil || d.EndAt.Sub(d.StartedAt) != time.Minute {
		t.Errorf("GET detail = %s", b)
	}

	resp, b = e.api(t, "POST", "/sandboxes/"+id+"/timeout", `{"timeout":10}`)
	if resp.StatusCode != 204 || len(b) != 0 {
		t.Errorf("POST timeout = %d %s, want 204 and no body", resp.StatusCode, b)
	}
	got, _ := e.m.Get(t.Context(), id)
	if left := time.Until(got.EndAt); left > 11*time.Second {
		t.Errorf("after timeout 10: %v left, want about 10s (shortened)", left)
	}
	resp, b = e.api(t, "POST", "/sandboxes/"+id+"/timeout", `{"timeout":-1}`)
	wantError(t, "POST timeout -1", resp, b, 400, "timeout")

	for _, path := range []string{"/sandboxes/" + id + "/connect", "/v2/sandboxes/" + id + "/connect"} {
		resp, b = e.api(t, "POST", path, `{"timeout":120}`)
		var c api.Sandbox
		json.Unmarshal(b, &c)
		if resp.StatusCode != 200 || c.SandboxID != id || c.EnvdAccessToken != s.EnvdAccessToken || c.EnvdVersion != api.EnvdVersion {
			t.Errorf("POST %s = %d %s, want 200 with the same token", path, resp.StatusCode, b)
		}
	}
	resp, b = e.api(t, "POST", "/v2/sandboxes/"+id+"/connect", `{}`)
	if resp.StatusCode != 200 {
		t.Errorf("POST v2 connect {} = %d %s", resp.StatusCode, b)
	}
	resp, _ = e.api(t, "POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":1}`)
	got, _ = e.m.Get(t.Context(), id)
	if resp.StatusCode != 200 || time.Until(got.EndAt) < time.Minute {
		t.Errorf("connect with a shorter timeout = %d, %v left; want 200 and no shortening", resp.StatusCode, time.Until(got.EndAt))
	}

	resp, b = e.api(t, "POST", "/sandboxes/"+id+"/refreshes", `{"duration":30}`)
	if resp.StatusCode != 204 {
		t.Errorf("POST refreshes = %d %s, want 204", resp.StatusCode, b)
	}
	resp, b = e.api(t, "POST", "/sandboxes/"+id+"/refreshes", "")
	if resp.StatusCode != 204 {
		t.Errorf("POST refreshes (no body) = %d %s, want 204", resp.StatusCode, b)
	}

	now := time.Now().Unix()
	resp, b = e.api(t, "GET", fmt.Sprintf("/sandboxes/%s/metrics?start=%d&end=%d", id, now-60, now+60), "")
	var ms []api.SandboxMetric
	if err := json.Unmarshal(b, &ms); resp.StatusCode != 200 || err != nil || len(ms) != 1 || ms[0].MemTotal == 0 || ms[0].TimestampUnix == 0 {
		t.Errorf("GET metrics = %d %s, want 200 with one sample", resp.StatusCode, b)
	}
	// A range that ended long before the sandbox has no readings.
	resp, b = e.api(t, "GET", "/sandboxes/"+id+"/metrics?start=1&end=2", "")
	if err := json.Unmarshal(b, &ms); resp.StatusCode != 200 || err != nil || len(ms) != 0 {
		t.Errorf("GET metrics in 1970 = %d %s, want 200 []", resp.StatusCode, b)
	}
	for _, q := range []string{"start=x", "start=10&end=5"} {
		if resp, b := e.api(t, "GET", "/sandboxes/"+id+"/metrics?"+q, ""); resp.StatusCode != 400 {
			t.Errorf("GET metrics?%s = %d %s, want 400", q, resp.StatusCode, b)
		}
	}

	resp, b = e.api(t, "POST", "/sandboxes/"+id+"/fork", `{}`)
	wantError(t, "POST fork", resp, b, 501, "fork")
	resp, b = e.api(t, "GET", "/snapshots", "")
	wantError(t, "GET snapshots", resp, b, 501, "snapshots")

	resp, b = e.api(t, "DELETE", "/sandboxes/"+id, "")
	if resp.StatusCode != 204 || len(b) != 0 {
		t.Errorf("DELETE = %d %s, want 204", resp.StatusCode, b)
	}
	for _, r := range []struct{ method, path, body string }{
		{"DELETE", "/sandboxes/" + id, ""},
		{"GET", "/sandboxes/" + id, ""},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":10}`},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{}`},
		{"POST", "/sandboxes/" + id + "/refreshes", `{}`},
		{"GET", "/sandboxes/" + id + "/metrics", ""},
		{"POST", "/sandboxes/" + id + "/pause", `{}`},
		{"POST", "/sandboxes/" + id + "/resume", `{}`},
	} {
		resp, b = e.api(t, r.method, r.path, r.body)
		wantError(t, r.method+" "+r.path+" after kill", resp, b, 404, "not found")
	}
}

func TestPathTraversalIDs(t *testing.T) {
	e := newTestEnv(t)
	for _, path := range []string{
		"/sandboxes/..%2f..%2fetc", "/sandboxes/%2e%2e", "/sandboxes/ABC", "/sandboxes/a%00b",
		"/sandboxes/" + strings.Repeat("a", 65),
	} {
		resp, b := e.api(t, "GET", path, "")
		if resp.StatusCode != 404 || !json.Valid(b) {
			t.Errorf("GET %s = %d %s, want 404 JSON", path, resp.StatusCode, b)
		}
		resp, b = e.api(t, "DELETE", path, "")
		if resp.StatusCode != 404 || !json.Valid(b) {
			t.Errorf("DELETE %s = %d %s, want 404 JSON", path, resp.StatusCode, b)
		}
	}
}

func listIDs(t *testing.T, b []byte) []string {
	t.Helper()
	var l []api.ListedSandbox
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatalf("list body %s: %v", b, err)
	}
	ids := []string{}
	for _, s := range l {
		if s.ClientID != api.ClientID || s.State != "running" || s.StartedAt.IsZero() || s.EndAt.IsZero() {
			t.Errorf("listed sandbox = %+v", s)
		}
		ids = append(ids, s.SandboxID)
	}
	return ids
}

func TestList(t *testing.T) {
	e := newTestEnv(t)
	var ids []string // oldest first
	for i := range 5 {
		md := fmt.Sprintf(`{"i":"%d","k":"v w"}`, i)
		if i%2 == 1 {
			md = fmt.Sprintf(`{"i":"%d","k":"other"}`, i)
		}
		ids = append(ids, e.create(t, `{"templateID":"base","metadata":`+md+`}`).SandboxID)
		time.Sleep(time.Millisecond) // distinct StartedAt, so newest-first is the creation order reversed
	}
	reversed := func(xs ...string) string {
		out := []string{}
		for i := len(xs) - 1; i >= 0; i-- {
			out = append(out, xs[i])
		}
		return fmt.Sprint(out)
	}

	resp, b := e.api(t, "GET", "/sandboxes", "")
	if got := fmt.Sprint(listIDs(t, b)); resp.StatusCode != 200 || got != reversed(ids...) {
		t.Errorf("GET /sandboxes = %d %s, want %s", resp.StatusCode, got, reversed(ids...))
	}
	// Exactly what the SDKs send for metadata {k:"v w"}.
	resp, b = e.api(t, "GET", "/v2/sandboxes?metadata=k%3Dv%252520w&state=running,paused", "")
	if got := fmt.Sprint(listIDs(t, b)); resp.StatusCode != 200 || got != reversed(ids[0], ids[2], ids[4]) {
		t.Errorf("GET /v2/sandboxes?metadata=k=v w = %d %s, want %s", resp.StatusCode, got, reversed(ids[0], ids[2], ids[4]))
	}
	_, b = e.api(t, "GET", "/sandboxes?metadata=k%3Dv%252520w%26i%3D2", "")
	if got := fmt.Sprint(listIDs(t, b)); got != fmt.Sprint([]string{ids[2]}) {
		t.Errorf("GET /sandboxes?metadata=k=v w&i=2 = %s, want [%s]", got, ids[2])
	}
	resp, b = e.api(t, "GET", "/v2/sandboxes?state=paused", "")
	if got := listIDs(t, b); resp.StatusCode != 200 || len(got) != 0 || string(bytes.TrimSpace(b)) != "[]" {
		t.Errorf("GET state=paused = %d %s, want []", resp.StatusCode, b)
	}

	// Pagination: 2 per page, X-Next-Token until the last page.
	var all []string
	next := ""
	for page := 0; ; page++ {
		if page > 5 {
			t.Fatal("pagination does not end")
		}
		path := "/v2/sandboxes?limit=2"
		if next != "" {
			path += "&nextToken=" + next
		}
		resp, b = e.api(t, "GET", path, "")
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s = %d %s", path, resp.StatusCode, b)
		}
		all = append(all, listIDs(t, b)...)
		next = resp.Header.Get(api.HeaderNextToken)
		if next == "" {
			break
		}
	}
	if fmt.Sprint(all) != reversed(ids...) {
		t.Errorf("paged list = %v, want %s", all, reversed(ids...))
	}

	for _, q := range []string{"limit=0", "limit=101", "limit=x", "state=bogus", "nextToken=%21%21", "metadata=novalue"} {
		resp, b = e.api(t, "GET", "/v2/sandboxes?"+q, "")
		wantError(t, "GET /v2/sandboxes?"+q, resp, b, 400, "")
	}
}

func TestParseMetadataFilter(t *testing.T) {
	tests := []struct {
		in   []string
		want map[string]string
		ok   bool
	}{
		{nil, nil, true},
		{[]string{"k=v%2520w"}, map[string]string{"k": "v w"}, true},
		{[]string{"a=1&b=2"}, map[string]string{"a": "1", "b": "2"}, true},
		{[]string{"a%253Db=c%2526d"}, map[string]string{"a=b": "c&d"}, true},
		{[]string{"a"}, nil, false},
		{[]string{"a=b=c"}, nil, false},
		{[]string{"=v"}, nil, false},
		{[]string{"a=%zz"}, nil, false},
	}
	for _, tt := range tests {
		got, err := parseMetadataFilter(tt.in)
		if (err == nil) != tt.ok || (tt.ok && fmt.Sprint(got) != fmt.Sprint(tt.want)) {
			t.Errorf("parseMetadataFilter(%q) = %v, %v; want %v, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestConcurrentCreates(t *testing.T) {
	e := newTestEnv(t)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			resp, b := e.api(t, "POST", "/v2/sandboxes", `{"templateID":"base"}`)
			if resp.StatusCode != 201 {
				t.Errorf("concurrent create = %d %s", resp.StatusCode, b)
			}
		})
	}
	wg.Wait()
	resp, b := e.api(t, "GET", "/sandboxes", "")
	if got := listIDs(t, b); resp.StatusCode != 200 || len(got) != 50 {
		t.Errorf("GET /sandboxes = %d, %d sandboxes; want 50", resp.StatusCode, len(got))
	}
}

func TestErrorStatusMapping(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{api.ErrNotFound, 404},
		{api.ErrInvalidArgument, 400},
		{api.ErrConflict, 409},
		{api.ErrResourceExhausted, 429},
		{api.ErrUnimplemented, 501},
		{api.ErrUnavailable, 503},
		{api.ErrPermissionDenied, 403},
		{api.ErrUnauthenticated, 401},
		{fmt.Errorf("x: %w", errTooLarge), 413},
		{errors.New("boom"), 500},
	}
	for _, tt := range tests {
		if got := statusOf(tt.err); got != tt.want {
			t.Errorf("statusOf(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
	if got := clientMessage(fmt.Errorf("secret path /x: %w", errors.New("io")), 500); got != "internal error" {
		t.Errorf("clientMessage(500) = %q, want internal error", got)
	}
	if got := clientMessage(fmt.Errorf("timeout bad: %w", api.ErrInvalidArgument), 400); got != "timeout bad" {
		t.Errorf("clientMessage(400) = %q, want %q", got, "timeout bad")
	}
}

// readEnvelope reads one Connect envelope.
func readEnvelope(r *bufio.Reader) ([]byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(hdr[1])<<24 | int(hdr[2])<<16 | int(hdr[3])<<8 | int(hdr[4])
	msg := make([]byte, n)
	_, err := io.ReadFull(r, msg)
	return msg, err
}

func TestListOrderAndStartedAfter(t *testing.T) {
	e := newTestEnv(t)
	first := e.create(t, `{"templateID":"base"}`)
	second := e.create(t, `{"templateID":"base"}`)
	var got []api.ListedSandbox
	resp, body := e.api(t, "GET", "/v2/sandboxes?order=asc", "")
	if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != 200 || len(got) != 2 ||
		got[0].SandboxID != first.SandboxID || got[1].SandboxID != second.SandboxID {
		t.Fatalf("GET ?order=asc = %d %s, want [%s %s]", resp.StatusCode, body, first.SandboxID, second.SandboxID)
	}
	after := url.QueryEscape(got[1].StartedAt.Format(time.RFC3339Nano))
	resp, body = e.api(t, "GET", "/v2/sandboxes?startedAfter="+after, "")
	if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != 200 || len(got) != 1 || got[0].SandboxID != second.SandboxID {
		t.Errorf("GET ?startedAfter=%s = %d %s, want only %s", after, resp.StatusCode, body, second.SandboxID)
	}
	for _, q := range []string{"order=sideways", "startedAfter=yesterday"} {
		if resp, body := e.api(t, "GET", "/v2/sandboxes?"+q, ""); resp.StatusCode != 400 {
			t.Errorf("GET ?%s = %d %s, want 400", q, resp.StatusCode, body)
		}
	}
}

// GET /sandboxes/metrics answers the latest reading of each sandbox
// named, keyed by its ID, with the fields of GET /sandboxes/{id}/metrics;
// sandboxes that do not exist or were killed are left out; a missing,
// empty, oversized or malformed list is 400 with E2B's error body.
func TestSandboxesMetrics(t *testing.T) {
	e := newTestEnv(t)
	a, b, gone := e.create(t, `{"templateID":"base"}`), e.create(t, `{"templateID":"base"}`), e.create(t, `{"templateID":"base"}`)
	if resp, body := e.api(t, "DELETE", "/sandboxes/"+gone.SandboxID, ""); resp.StatusCode != 204 {
		t.Fatalf("DELETE = %d %s", resp.StatusCode, body)
	}
	ids := strings.Join([]string{a.SandboxID, b.SandboxID + "-" + api.ClientID, gone.SandboxID, "nosuchsandbox"}, ",")
	resp, body := e.api(t, "GET", "/sandboxes/metrics?sandbox_ids="+ids, "")
	var got struct {
		Sandboxes map[string]map[string]any `json:"sandboxes"`
	}
	if err := json.Unmarshal(body, &got); resp.StatusCode != 200 || err != nil {
		t.Fatalf("GET /sandboxes/metrics?sandbox_ids=%s = %d %s, want 200", ids, resp.StatusCode, body)
	}
	if len(got.Sandboxes) != 2 || got.Sandboxes[a.SandboxID] == nil || got.Sandboxes[b.SandboxID] == nil {
		t.Errorf("GET /sandboxes/metrics?sandbox_ids=%s = %s, want %s and %s only", ids, body, a.SandboxID, b.SandboxID)
	}
	fields := []string{"timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "memCache", "diskUsed", "diskTotal"}
	for id, m := range got.Sandboxes {
		for _, f := range fields {
			if _, ok := m[f]; !ok {
				t.Errorf("metrics of %s: no %q in %v", id, f, m)
			}
		}
		if m["memTotal"] == 0.0 || m["timestampUnix"] == 0.0 {
			t.Errorf("metrics of %s = %v, want a reading", id, m)
		}
	}
	// Only unknown sandboxes: an empty map, not null.
	resp, body = e.api(t, "GET", "/sandboxes/metrics?sandbox_ids=nosuchsandbox", "")
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != `{"sandboxes":{}}` {
		t.Errorf("GET /sandboxes/metrics of an unknown sandbox = %d %s, want 200 {\"sandboxes\":{}}", resp.StatusCode, body)
	}

	many := make([]string, 101)
	for i := range many {
		many[i] = fmt.Sprintf("sbx%d", i)
	}
	tests := []struct{ name, query, msg string }{
		{"missing", "", "sandbox_ids is required"},
		{"empty", "?sandbox_ids=", "Invalid sandbox ID"},
		{"empty item", "?sandbox_ids=" + a.SandboxID + ",", "Invalid sandbox ID"},
		{"too many", "?sandbox_ids=" + strings.Join(many, ","), "Too many sandboxes requested, maximum is 100"},
		{"malformed", "?sandbox_ids=../etc", "Invalid sandbox ID"},
		{"twice", "?sandbox_ids=" + a.SandboxID + "," + a.SandboxID, "named twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := e.api(t, "GET", "/sandboxes/metrics"+tt.query, "")
			wantError(t, "GET /sandboxes/metrics"+tt.query, resp, body, 400, tt.msg)
		})
	}
	// 100 IDs are within the bound.
	if resp, body := e.api(t, "GET", "/sandboxes/metrics?sandbox_ids="+strings.Join(many[:100], ","), ""); resp.StatusCode != 200 {
		t.Errorf("GET /sandboxes/metrics of 100 sandboxes = %d %s, want 200", resp.StatusCode, body)
	}
}
