package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/gateway"
)

// decodeSecret checks a Secret body: no value key, metadata present.
func decodeSecret(t *testing.T, b []byte) api.Secret {
	t.Helper()
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("body %s: %v", b, err)
	}
	if _, ok := raw["value"]; ok {
		t.Errorf("Secret body has a value key: %s", b)
	}
	if md, ok := raw["metadata"]; !ok || string(md) == "null" {
		t.Errorf("Secret body without metadata object: %s", b)
	}
	var s api.Secret
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func noStore(t *testing.T, resp *http.Response) {
	t.Helper()
	if got := resp.Header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("%s %s: Cache-Control %q, want no-store", resp.Request.Method, resp.Request.URL.Path, got)
	}
}

func TestSecretsRoutes(t *testing.T) {
	e := newTestEnv(t)
	const value = "sk-live-VALUE-8d1f0c2b9e"
	resp, b := e.api(t, "POST", "/secrets", `{"name":"OpenAI-Key","value":"`+value+`","metadata":{"team":"ml"}}`)
	noStore(t, resp)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /secrets = %d %s", resp.StatusCode, b)
	}
	created := decodeSecret(t, b)
	if !strings.HasPrefix(created.SecretID, "sec_") || len(created.SecretID) != 30 || created.Name != "openai-key" ||
		created.CurrentVersion != 1 || created.Metadata["team"] != "ml" || created.CreatedAt.IsZero() {
		t.Errorf("created %+v", created)
	}
	for _, path := range []string{"/secrets/" + created.SecretID, "/secrets/openai-key", "/secrets/OPENAI%2DKEY",
		"/secrets/%20openai-key%20", "/secrets/" + strings.ToUpper(created.SecretID)} {
		resp, b := e.api(t, "GET", path, "")
		noStore(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d %s", path, resp.StatusCode, b)
			continue
		}
		if s := decodeSecret(t, b); s.SecretID != created.SecretID {
			t.Errorf("GET %s = %+v", path, s)
		}
	}

	// Update: metadata absent or null keeps, {} replaces.
	for i, tc := range []struct {
		body string
		md   int
	}{
		{`{"value":"v2"}`, 1},
		{`{"value":"v3","metadata":null}`, 1},
		{`{"value":"v4","metadata":{}}`, 0},
	} {
		resp, b := e.api(t, "POST", "/secrets/openai-key", tc.body)
		noStore(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /secrets/openai-key %s = %d %s", tc.body, resp.StatusCode, b)
		}
		s := decodeSecret(t, b)
		if s.CurrentVersion != int64(i+2) || len(s.Metadata) != tc.md {
			t.Errorf("update %s = %+v, want version %d and %d metadata", tc.body, s, i+2, tc.md)
		}
	}
	if v, err := e.sec.Value(t.Context(), "openai-key"); err != nil || v != "v4" {
		t.Errorf("stored value %q, %v", v, err)
	}

	// Paging: 3 secrets, limit 2.
	for _, n := range []string{"b", "c"} {
		if resp, b := e.api(t, "POST", "/secrets", `{"name":"`+n+`","value":"x"}`); resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST /secrets %s = %d %s", n, resp.StatusCode, b)
		}
	}
	resp, b = e.api(t, "GET", "/secrets?limit=2", "")
	noStore(t, resp)
	var page []api.Secret
	json.Unmarshal(b, &page)
	next := resp.Header.Get(api.HeaderNextToken)
	if resp.StatusCode != http.StatusOK || len(page) != 2 || next == "" {
		t.Fatalf("GET /secrets?limit=2 = %d %s next %q", resp.StatusCode, b, next)
	}
	resp, b = e.api(t, "GET", "/secrets?limit=2&nextToken="+next, "")
	page = nil
	json.Unmarshal(b, &page)
	if resp.StatusCode != http.StatusOK || len(page) != 1 || resp.Header.Get(api.HeaderNextToken) != "" {
		t.Errorf("second page = %d %s next %q", resp.StatusCode, b, resp.Header.Get(api.HeaderNextToken))
	}
	resp, b = e.api(t, "GET", "/secrets", "")
	if !strings.HasPrefix(string(b), "[") || strings.Count(string(b), "secretID") != 3 || resp.Header.Get(api.HeaderNextToken) != "" {
		t.Errorf("GET /secrets = %s", b)
	}
	if strings.Contains(string(b), value) || strings.Contains(string(b), `"value"`) {
		t.Errorf("list holds a value: %s", b)
	}

	resp, b = e.api(t, "DELETE", "/secrets/"+created.SecretID, "")
	noStore(t, resp)
	if resp.StatusCode != http.StatusNoContent || len(b) != 0 {
		t.Errorf("DELETE = %d %q", resp.StatusCode, b)
	}
	resp, _ = e.api(t, "GET", "/secrets/openai-key", "")
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET after DELETE = %d", resp.StatusCode)
	}
}

func TestSecretsErrors(t *testing.T) {
	e := newTestEnv(t)
	const echo = "echo-me-7731"
	if resp, b := e.api(t, "POST", "/secrets", `{"name":"taken","value":"x"}`); resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /secrets = %d %s", resp.StatusCode, b)
	}
	bigValue := strings.Repeat("v", 64<<10+1)
	huge := `{"name":"` + echo + `","value":"` + strings.Repeat("v", 2<<20) + `"}`
	for _, tc := range []struct {
		method, path, body string
		status             int
		msg                string
		noKey              bool
	}{
		{"POST", "/secrets", `{"name":"` + echo, 400, api.SecretMsgInvalid, false},
		{"POST", "/secrets", ``, 400, api.SecretMsgInvalid, false},
		{"POST", "/secrets", `{"name":"` + echo + `"}`, 400, api.SecretMsgInvalid, false},
		{"POST", "/secrets", `{"name":"` + echo + `.x","value":"v"}`, 400, api.SecretMsgInvalid, false},
		{"POST", "/secrets", `{"name":"sec_` + echo + `","value":"v"}`, 400, api.SecretMsgInvalid, false},
		{"POST", "/secrets", `{"name":"` + echo + `","value":""}`, 400, api.SecretMsgInvalid, false},
		{"POST", "/secrets", `{"name":"` + echo + `","value":"` + bigValue + `"}`, 400, api.SecretMsgInvalid, false},
		{"POST", "/secrets", huge, 400, api.SecretMsgInvalid, false},
		{"POST", "/secrets", `{"name":"` + echo + `","value":"v","metadata":{"` + strings.Repeat("k", 129) + `":"v"}}`, 400, api.SecretMsgInvalid, false},
		{"POST", "/secrets", `{"name":"TAKEN","value":"` + echo + `"}`, 409, api.SecretMsgConflict, false},
		{"GET", "/secrets/sec_" + echo, "", 400, api.SecretMsgInvalid, false},
		{"GET", "/secrets/" + echo + "%2Fx", "", 400, api.SecretMsgInvalid, false},
		{"GET", "/secrets/" + echo, "", 404, api.SecretMsgNotFound, false},
		{"GET", "/secrets/" + echo + "/x", "", 404, api.SecretMsgNotFound, false},
		{"GET", "/secrets?limit=0", "", 400, api.SecretMsgInvalid, false},
		{"GET", "/secrets?limit=101", "", 400, api.SecretMsgInvalid, false},
		{"GET", "/secrets?limit=" + echo, "", 400, api.SecretMsgInvalid, false},
		{"GET", "/secrets?nextToken=" + echo, "", 400, api.SecretMsgInvalid, false},
		{"POST", "/secrets/" + echo, `{"value":"v"}`, 404, api.SecretMsgNotFound, false},
		{"POST", "/secrets/taken", `{"metadata":{}}`, 400, api.SecretMsgInvalid, false},
		{"POST", "/secrets/taken", `{"value":"` + bigValue + `"}`, 400, api.SecretMsgInvalid, false},
		{"DELETE", "/secrets/" + echo, "", 404, api.SecretMsgNotFound, false},
		{"PUT", "/secrets/" + echo, `{}`, 405, "Method not allowed", false},
		{"GET", "/secrets/" + echo, "", 401, "You are not authenticated", true},
		{"POST", "/secrets", `{"name":"` + echo + `","value":"v"}`, 401, "You are not authenticated", true},
	} {
		hdr := []string{"X-API-Key: " + testKey}
		if tc.noKey {
			hdr = nil
		}
		resp, b := e.do(t, tc.method, tc.path, tc.body, hdr...)
		what := tc.method + " " + tc.path[:min(len(tc.path), 60)]
		noStore(t, resp)
		var body api.Error
		if err := json.Unmarshal(b, &body); err != nil {
			t.Errorf("%s: body %q: %v", what, b, err)
			continue
		}
		if resp.StatusCode != tc.status || body.Code != tc.status || body.Message != tc.msg {
			t.Errorf("%s = %d %s, want %d %q", what, resp.StatusCode, b, tc.status, tc.msg)
		}
		if strings.Contains(string(b), echo) || strings.Contains(string(b), "taken") {
			t.Errorf("%s echoes its input: %s", what, b)
		}
	}
	// Nothing was stored by the refused requests.
	if resp, b := e.api(t, "GET", "/secrets", ""); strings.Count(string(b), "secretID") != 1 {
		t.Errorf("after refused requests GET /secrets = %d %s", resp.StatusCode, b)
	}

	// A failing backend is 502 with the fixed message.
	e.st.Close()
	resp, b := e.api(t, "GET", "/secrets/taken", "")
	noStore(t, resp)
	var body api.Error
	json.Unmarshal(b, &body)
	if resp.StatusCode != http.StatusBadGateway || body.Code != 502 || body.Message != api.SecretMsgBackend {
		t.Errorf("GET with the database closed = %d %s, want 502 %q", resp.StatusCode, b, api.SecretMsgBackend)
	}
}

// Other routes keep their caching headers and messages.
func TestSecretsHeadersOnlyUnderSecrets(t *testing.T) {
	e := newTestEnv(t)
	for _, p := range []string{"/sandboxes", "/secretsx", "/v2/sandboxes"} {
		resp, _ := e.api(t, "GET", p, "")
		if resp.Header.Get("Cache-Control") == "no-store" {
			t.Errorf("GET %s has Cache-Control no-store", p)
		}
	}
	resp, b := e.api(t, "GET", "/secretsx", "")
	if resp.StatusCode != 404 || strings.Contains(string(b), api.SecretMsgNotFound) {
		t.Errorf("GET /secretsx = %d %s", resp.StatusCode, b)
	}
}

func TestSandboxDownloads(t *testing.T) {
	e := newTestEnv(t)
	ctx := t.Context()
	resp, b := e.api(t, "GET", "/sandboxes/neverknown123/downloads", "")
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), `"code":404`) {
		t.Errorf("downloads of an unknown sandbox = %d %s", resp.StatusCode, b)
	}
	resp, _ = e.api(t, "GET", "/sandboxes/..%2Fx/downloads", "")
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("downloads of a malformed ID = %d", resp.StatusCode)
	}
	s := e.create(t, `{"templateID":"base"}`)
	resp, b = e.api(t, "GET", "/sandboxes/"+s.SandboxID+"/downloads", "")
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != "[]" {
		t.Errorf("downloads of a new sandbox = %d %s, want []", resp.StatusCode, b)
	}
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	sum := strings.Repeat("ab", 32)
	if err := e.dl.RecordDownload(ctx, gateway.Download{SandboxID: s.SandboxID, Time: at, Ecosystem: "npm",
		Name: "left-pad", Version: "1.3.0", URL: "https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz",
		Size: 1234, SHA256: sum}); err != nil {
		t.Fatal(err)
	}
	if resp, b := e.api(t, "DELETE", "/sandboxes/"+s.SandboxID, ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("kill = %d %s", resp.StatusCode, b)
	}
	// Kept after the sandbox is killed.
	resp, b = e.api(t, "GET", "/sandboxes/"+s.SandboxID+"/downloads", "")
	var got []map[string]any
	if err := json.Unmarshal(b, &got); err != nil || resp.StatusCode != http.StatusOK || len(got) != 1 {
		t.Fatalf("downloads after kill = %d %s", resp.StatusCode, b)
	}
	want := map[string]any{"ecosystem": "npm", "name": "left-pad", "version": "1.3.0",
		"url": "https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz", "size": float64(1234), "sha256": sum,
		"time": "2026-12-01T10:00:00Z"}
	for k, v := range want {
		if got[0][k] != v {
			t.Errorf("download %s = %v, want %v", k, got[0][k], v)
		}
	}
	if len(got[0]) != len(want) {
		t.Errorf("download has keys %v", got[0])
	}
	if resp, _ := e.do(t, "GET", "/sandboxes/"+s.SandboxID+"/downloads", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("downloads without the API key = %d", resp.StatusCode)
	}
}
