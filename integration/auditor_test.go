package integration

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

var lastUsed = regexp.MustCompile(`"lastUsed":("[^"]*"|null)`)

// TestAuditorRole: a key of role auditor (made with fence key create
// --role auditor, or the API's role field) reads its team's audit trail,
// usage, metrics and lists, and is answered 403 (E2B's error body) on
// every other route, sandbox traffic included, with nothing changed;
// the audit trail names it on its refused requests. Root: namespaces.
func TestAuditorRole(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t))
	team := tenancy.DefaultTeamID
	for _, body := range []string{`{"name":"x","role":"root"}`, `{"name":"x","role":"Auditor"}`} {
		wantE2BError(t, d.do(t, "POST", "/api-keys", d.Key, strings.NewReader(body), nil), http.StatusBadRequest, "role")
	}
	wantE2BError(t, d.do(t, "POST", "/access-tokens", d.Key, strings.NewReader(`{"name":"x","role":"auditor"}`), nil), http.StatusBadRequest, "role")
	out, errs, code := d.fenceCLI(t, nil, "key", "create", "compliance", "--role", "auditor", "--json")
	var created api.CreatedTeamAPIKey
	if code != 0 || json.Unmarshal([]byte(out), &created) != nil || created.Role != tenancy.RoleAuditor {
		t.Fatalf("fence key create --role auditor: exit %d %q %q", code, out, errs)
	}
	aud := created.Key

	sb := d.create(t, api.NewSandbox{})
	if r := d.do(t, "POST", "/secrets", d.Key, strings.NewReader(`{"name":"tok","value":"value-0123456789"}`), nil); r.Status != http.StatusCreated {
		t.Fatalf("POST /secrets = %d %s", r.Status, r.Body)
	}
	state := func() string {
		var b strings.Builder
		for _, p := range []string{"/sandboxes/" + sb.ID(), "/secrets/tok", "/snapshots", "/teams/" + team + "/limits", "/api-keys"} {
			r := d.do(t, "GET", p, d.Key, nil, nil)
			// A key's use is not a change.
			b.WriteString(p + " " + lastUsed.ReplaceAllString(string(r.Body), "") + "\n")
		}
		return b.String()
	}
	before := state()

	for _, p := range []string{"/audit", "/usage", "/usage?team=" + team, "/teams/" + team + "/metrics",
		"/teams/" + team + "/metrics/max?metric=concurrent_sandboxes", "/teams/" + team + "/limits", "/teams/" + team + "/limits/usage",
		"/sandboxes", "/v2/sandboxes", "/sandboxes/metrics?sandbox_ids=" + sb.ID(), "/sandboxes/" + sb.ID() + "/metrics",
		"/sandboxes/" + sb.ID() + "/logs", "/v2/sandboxes/" + sb.ID() + "/logs", "/sandboxes/" + sb.ID() + "/checkpoints",
		"/snapshots", "/secrets", "/templates", "/v2/templates"} {
		if r := d.do(t, "GET", p, aud, nil, nil); r.Status != http.StatusOK {
			t.Errorf("GET %s (auditor) = %d %s, want 200", p, r.Status, r.Body)
		}
	}
	if r := d.do(t, "GET", "/v2/sandboxes", aud, nil, nil); !strings.Contains(string(r.Body), sb.ID()) {
		t.Errorf("the auditor's list leaves its team's sandbox out: %s", r.Body)
	}

	const refusal = "this API key has the auditor role"
	for _, rt := range []struct{ method, path, body string }{
		{"POST", "/sandboxes", `{"templateID":"minimal"}`},
		{"POST", "/v2/sandboxes", `{"templateID":"minimal"}`},
		{"GET", "/sandboxes/{id}", ""}, // holds the sandbox's access token
		{"DELETE", "/sandboxes/{id}", ""},
		{"POST", "/sandboxes/{id}/timeout", `{"timeout":3600}`},
		{"POST", "/sandboxes/{id}/pause", ""},
		{"POST", "/sandboxes/{id}/resume", `{"timeout":60}`},
		{"POST", "/sandboxes/{id}/connect", `{"timeout":60}`},
		{"POST", "/v2/sandboxes/{id}/connect", `{"timeout":60}`},
		{"POST", "/sandboxes/{id}/refreshes", `{"duration":60}`},
		{"GET", "/sandboxes/{id}/export", ""},
		{"GET", "/sandboxes/{id}/diff", ""},
		{"POST", "/sandboxes/{id}/fork", `{"count":1}`},
		{"POST", "/sandboxes/{id}/snapshots", `{"name":"aud"}`},
		{"POST", "/sandboxes/{id}/checkpoints", `{}`},
		{"POST", "/sandboxes/{id}/rewind", `{"checkpointID":"cp_x"}`},
		{"PUT", "/sandboxes/{id}/network", `{"allowOut":["example.com"],"denyOut":["ALL_TRAFFIC"]}`},
		{"PUT", "/sandboxes/zzzzzzzzzzzzzzzzzzzz/network", `{"allowOut":["example.com"]}`}, // unknown: the same 403
		{"POST", "/secrets", `{"name":"aud","value":"v-0123456789"}`},
		{"GET", "/secrets/tok", ""},
		{"POST", "/secrets/tok", `{"value":"overwritten"}`},
		{"DELETE", "/secrets/tok", ""},
		{"POST", "/v3/templates", `{"name":"aud-tpl"}`},
		{"POST", "/v2/templates/x/builds/b", `{}`},
		{"POST", "/templates/tags", `{"target":"minimal","tags":["x"]}`},
		{"DELETE", "/templates/tags", `{"name":"minimal","tags":["x"]}`},
		{"DELETE", "/templates/minimal", ""},
		{"PATCH", "/templates/minimal", `{"public":true}`},
		{"PATCH", "/v2/templates/minimal", `{"public":true}`},
		{"PUT", "/teams/" + team + "/limits", `{"concurrentSandboxes":1}`},
		{"GET", "/teams", ""}, // makes a key
		{"GET", "/api-keys", ""},
		{"POST", "/api-keys", `{"name":"escalated"}`},
		{"PATCH", "/api-keys/" + created.ID, `{"name":"renamed"}`},
		{"DELETE", "/api-keys/" + created.ID, ""},
		{"POST", "/access-tokens", `{"name":"t"}`},
		{"POST", "/admin/teams", `{"name":"t"}`},
		{"POST", "/admin/teams/" + team + "/sandboxes/kill", ""},
		{"POST", "/ssh-keys", `{"name":"k","publicKey":"ssh-ed25519 AAAA"}`},
		{"POST", "/approvals/x", `{"decision":"once"}`},
		{"GET", "/metrics", ""},
	} {
		path := strings.ReplaceAll(rt.path, "{id}", sb.ID())
		var body *strings.Reader
		var r rawResponse
		if rt.body != "" {
			body = strings.NewReader(rt.body)
			r = d.do(t, rt.method, path, aud, body, nil)
		} else {
			r = d.do(t, rt.method, path, aud, nil, nil)
		}
		var e api.Error
		if r.Status != http.StatusForbidden || json.Unmarshal(r.Body, &e) != nil || e.Code != 403 || !strings.HasPrefix(e.Message, refusal) {
			t.Errorf("%s %s (auditor) = %d %s, want 403 %q", rt.method, path, r.Status, r.Body, refusal)
		}
	}
	// Sandbox traffic that carries the auditor's key.
	hdr := map[string]string{api.HeaderSandboxID: sb.ID(), api.HeaderSandboxPort: "49983", api.HeaderAccessToken: sb.EnvdAccessToken}
	if r := d.do(t, "GET", "/health", aud, nil, hdr); r.Status != http.StatusForbidden {
		t.Errorf("envd traffic with the auditor's key = %d %s, want 403", r.Status, r.Body)
	}
	if after := state(); after != before {
		t.Errorf("the auditor's requests changed the team's objects:\n%s\nwas\n%s", after, before)
	}

	// The audit trail names the auditor on its refused requests (the
	// trail is written behind the answers).
	eventually(t, 30*time.Second, "an audit record naming the auditor on a refused request", func() bool {
		var recs []struct {
			Actor string
			Data  map[string]any
		}
		if r := d.do(t, "GET", "/audit?type=api&limit=1000", aud, nil, nil); r.Status != 200 || json.Unmarshal(r.Body, &recs) != nil {
			t.Fatalf("GET /audit = %d %s", r.Status, r.Body)
		}
		for _, rec := range recs {
			if rec.Actor == "team:"+team+" key:"+created.ID && rec.Data["status"] == float64(403) {
				return true
			}
		}
		return false
	})
}
