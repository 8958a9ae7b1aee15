package httpapi

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

func (e *testEnv) detail(t *testing.T, id string) (api.SandboxDetail, string) {
	t.Helper()
	resp, b := e.api(t, "GET", "/sandboxes/"+id, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /sandboxes/%s = %d %s", id, resp.StatusCode, b)
	}
	var d api.SandboxDetail
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return d, string(b)
}

// allowed reports whether the sandbox's current policy allows a TCP flow
// to dst (handed out for names).
func (e *testEnv) allowed(t *testing.T, id, dst string, names ...string) bool {
	t.Helper()
	nw := e.net.Net(id)
	if nw == nil {
		t.Fatalf("sandbox %s has no fence", id)
	}
	p := nw.Policy()
	if p == nil {
		return false
	}
	return p.Decide(policy.Flow{Proto: policy.TCP, Dst: netip.MustParseAddrPort(dst), Names: names}).Allow
}

func TestNetworkCreateAndGetInfo(t *testing.T) {
	e := newTestEnv(t)
	sb := e.create(t, `{"templateID":"base","network":{
		"denyOut":["0.0.0.0/0"],"allowOut":["1.1.1.1","API.example.com"],
		"rules":{"API.example.com":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.key}"}}}],"other.example":[{"transform":null}]},
		"egressProxy":{"address":"198.51.100.5:1080","username":"alice","password":"hunter2-pw"},
		"allowPublicTraffic":true,"maskRequestHost":"h:${PORT}"}}`)
	d, raw := e.detail(t, sb.SandboxID)
	if strings.Contains(raw, "hunter2-pw") || strings.Contains(raw, "password") {
		t.Errorf("getInfo = %s: shows the proxy password", raw)
	}
	n := d.Network
	if n == nil || strings.Join(n.AllowOut, ",") != "1.1.1.1,API.example.com" || strings.Join(n.DenyOut, ",") != "0.0.0.0/0" ||
		n.EgressProxy == nil || n.EgressProxy.Address != "198.51.100.5:1080" || n.EgressProxy.Username != "alice" ||
		n.AllowPublicTraffic == nil || !*n.AllowPublicTraffic || n.MaskRequestHost != "h:${PORT}" {
		t.Errorf("getInfo network = %s", raw)
	}
	if rs := n.Rules["api.example.com"]; len(rs) != 1 || rs[0].Transform.Headers["Authorization"] != "Bearer ${e2b.secrets.key}" {
		t.Errorf("getInfo rules = %+v, want the rule under the lower-cased domain", n.Rules)
	}
	if d.AllowInternetAccess != nil {
		t.Errorf("allowInternetAccess = %v, want null (not sent)", *d.AllowInternetAccess)
	}
	for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
		if _, b := e.api(t, "GET", path, ""); strings.Contains(string(b), "hunter2-pw") {
			t.Errorf("GET %s shows the proxy password", path)
		}
	}
	if !e.allowed(t, sb.SandboxID, "1.1.1.1:443") || e.allowed(t, sb.SandboxID, "8.8.8.8:443") ||
		!e.allowed(t, sb.SandboxID, "8.8.8.8:443", "api.example.com") {
		t.Errorf("policy does not follow allowOut exceptions to a deny-all")
	}
	if p := e.net.Net(sb.SandboxID).Proxy(); p == nil || p.Password != "hunter2-pw" {
		t.Errorf("sandbox egress proxy = %v, want the configured one with its password", p)
	}

	// No network: no network field, null allowInternetAccess.
	plain := e.create(t, `{"templateID":"base"}`)
	if _, raw := e.detail(t, plain.SandboxID); strings.Contains(raw, `"network"`) || !strings.Contains(raw, `"allowInternetAccess":null`) {
		t.Errorf("getInfo without network = %s", raw)
	}
	// The daemon default (deny) applies to a create that says nothing;
	// an explicit true (js245, py245) opens everything.
	if e.allowed(t, plain.SandboxID, "8.8.8.8:443") {
		t.Errorf("a create that says nothing is open under a deny default")
	}
	open := e.create(t, `{"templateID":"base","allow_internet_access":true}`)
	if d, _ := e.detail(t, open.SandboxID); d.AllowInternetAccess == nil || !*d.AllowInternetAccess || !e.allowed(t, open.SandboxID, "8.8.8.8:443") {
		t.Errorf("allow_internet_access true: not shown or not open")
	}
}

func TestNetworkCreateInvalid(t *testing.T) {
	e := newTestEnv(t)
	for _, tt := range []struct{ body, msg string }{
		{`{"network":{"denyOut":["example.com"]}}`, "invalid denied CIDR example.com"},
		{`{"network":{"denyOut":["0.0.0.0"]}}`, "invalid denied CIDR 0.0.0.0"},
		{`{"network":{"allowOut":["example.com"]}}`, "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic."},
		{`{"allow_internet_access":false,"network":{"allowOut":["example.com"]}}`, "you must include 'ALL_TRAFFIC'"},
		{`{"network":{"allowOut":["@nope"],"denyOut":["0.0.0.0/0"]}}`, "unknown preset"},
		{`{"network":{"rules":{"*":[]}}}`, "is not a DNS name"},
		{`{"network":{"rules":{"a.example":[{},{}]}}}`, "at most 1 is allowed"},
		{`{"network":{"rules":{"a.example":[{"transform":{"headers":{"X":"${e2b.secrets.k"}}}]}}}`, "Network transform header contains a malformed E2B placeholder."},
		{`{"network":{"rules":{"a.example":[{"transform":{"headers":{"X":"${e2b.identity.tokens.aws}"}}}]}}}`, "not supported by fence"},
		{`{"network":{"egressProxy":{"address":"127.0.0.1:1080"}}}`, "Invalid egress proxy config: "},
		{`{"network":{"egressProxy":{"address":"198.51.100.5:1080","password":"p"}}}`, "Invalid egress proxy config: a password needs a username"},
		{`{"network":{"passthrough":["*"]}}`, "passthrough entry"},
		{`{"envVars":{"K":"v"},"secrets":{"K":{"secret":"k","hosts":["a.example"]}}}`, "also in envVars"},
		{`{"secrets":{"K":{"secret":"k","hosts":[]}}}`, "at least one host"},
		{`{"secrets":{"K":{"secret":"k","hosts":["a.example"],"places":["body"]}}}`, "not one of header, query, basicAuth"},
	} {
		body := `{"templateID":"base",` + strings.TrimPrefix(tt.body, "{")
		resp, b := e.api(t, "POST", "/v2/sandboxes", body)
		wantError(t, body, resp, b, http.StatusBadRequest, tt.msg)
		if strings.Contains(string(b), "hunter2") {
			t.Errorf("%s: error shows a password", body)
		}
	}
	if _, b := e.api(t, "GET", "/v2/sandboxes", ""); strings.TrimSpace(string(b)) != "[]" {
		t.Errorf("invalid creates left sandboxes: %s", b)
	}
}

func TestNetworkUpdate(t *testing.T) {
	e := newTestEnv(t)
	sb := e.create(t, `{"templateID":"base","allow_internet_access":true,"network":{"denyOut":["0.0.0.0/0"],"allowOut":["1.1.1.1"],
		"rules":{"a.example":[{"transform":{"headers":{"X":"1"}}}]},"egressProxy":{"address":"198.51.100.5:1080","username":"u","password":"pw-secret"},
		"allowPublicTraffic":false,"maskRequestHost":"m"}}`)
	id := sb.SandboxID
	put := func(body string) (*http.Response, []byte) {
		return e.api(t, "PUT", "/sandboxes/"+id+"/network", body)
	}
	if e.allowed(t, id, "8.8.8.8:443") {
		t.Fatal("8.8.8.8 open under deny-all")
	}

	// Invalid updates change nothing.
	_, before := e.detail(t, id)
	for _, tt := range []struct{ body, msg string }{
		{`{"denyOut":["example.com"]}`, "invalid denied CIDR example.com"},
		{`{"allowOut":["example.com"]}`, "you must include 'ALL_TRAFFIC'"},
		{`{"rules":{"a.example":[{"transform":{"headers":{"X":"${e2b.secrets.}"}}}]}}`, "malformed E2B placeholder"},
		{`{"egressProxy":{"address":"10.0.0.1:1080"}}`, "Invalid egress proxy config: "},
		{`not json`, "malformed JSON"},
	} {
		resp, b := put(tt.body)
		wantError(t, "PUT "+tt.body, resp, b, http.StatusBadRequest, tt.msg)
	}
	if _, after := e.detail(t, id); after != before {
		t.Errorf("invalid PUTs changed getInfo:\n%s\n%s", before, after)
	}
	if e.allowed(t, id, "8.8.8.8:443") {
		t.Errorf("invalid PUTs changed the policy")
	}

	// A replacement: omitted fields are cleared, ingress fields stay.
	resp, b := put(`{"denyOut":["0.0.0.0/0"],"allowOut":["8.8.8.8","*.example.org"],"allowPublicTraffic":true}`)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT = %d %s", resp.StatusCode, b)
	}
	d, raw := e.detail(t, id)
	if n := d.Network; n == nil || strings.Join(n.AllowOut, ",") != "8.8.8.8,*.example.org" || len(n.Rules) != 0 || n.EgressProxy != nil ||
		n.AllowPublicTraffic == nil || *n.AllowPublicTraffic || n.MaskRequestHost != "m" {
		t.Errorf("getInfo after PUT = %s", raw)
	}
	if !e.allowed(t, id, "8.8.8.8:443") || e.allowed(t, id, "1.1.1.1:443") || !e.allowed(t, id, "9.9.9.9:443", "a.example.org") {
		t.Errorf("policy after PUT does not follow the new lists")
	}
	if p := e.net.Net(id).Proxy(); p != nil {
		t.Errorf("egress proxy after a PUT without one = %v, want none", p)
	}

	// {} removes every list, rule and proxy and re-opens traffic; the
	// stored allow_internet_access stays as it was.
	if resp, b := put(`{"allow_internet_access":false}`); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT false = %d %s", resp.StatusCode, b)
	}
	if d, _ := e.detail(t, id); d.AllowInternetAccess == nil || *d.AllowInternetAccess || e.allowed(t, id, "8.8.8.8:443") {
		t.Errorf("PUT allow_internet_access false: not stored or not applied")
	}
	if resp, b := put(`{}`); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT {} = %d %s", resp.StatusCode, b)
	}
	d, raw = e.detail(t, id)
	if n := d.Network; n == nil || len(n.AllowOut)+len(n.DenyOut)+len(n.Rules) != 0 || n.EgressProxy != nil || n.MaskRequestHost != "m" {
		t.Errorf("getInfo after PUT {} = %s, want only the ingress fields", raw)
	}
	if d.AllowInternetAccess == nil || *d.AllowInternetAccess {
		t.Errorf("allowInternetAccess after PUT {} = %v, want the stored false", d.AllowInternetAccess)
	}
	if !e.allowed(t, id, "8.8.8.8:443") {
		t.Errorf("PUT {} did not re-open traffic")
	}

	// A proxy set by PUT: shown without its password, given to the sandbox.
	if resp, b := put(`{"egressProxy":{"address":"198.51.100.6:1080","username":"bob","password":"pw-two"}}`); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT proxy = %d %s", resp.StatusCode, b)
	}
	if _, raw := e.detail(t, id); strings.Contains(raw, "pw-two") || !strings.Contains(raw, `"egressProxy":{"address":"198.51.100.6:1080","username":"bob"}`) {
		t.Errorf("getInfo after PUT proxy = %s", raw)
	}
	if p := e.net.Net(id).Proxy(); p == nil || p.Address != "198.51.100.6:1080" || p.Password != "pw-two" {
		t.Errorf("sandbox egress proxy = %v", p)
	}

	// Without ingress fields, {} leaves no network at all.
	plain := e.create(t, `{"templateID":"base","network":{"denyOut":["0.0.0.0/0"]}}`)
	if resp, b := e.api(t, "PUT", "/sandboxes/"+plain.SandboxID+"/network", `{}`); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT {} = %d %s", resp.StatusCode, b)
	}
	if _, raw := e.detail(t, plain.SandboxID); strings.Contains(raw, `"network"`) {
		t.Errorf("getInfo after PUT {} = %s, want no network", raw)
	}

	resp, b = e.api(t, "PUT", "/sandboxes/nosuchsandbox/network", `{}`)
	wantError(t, "PUT unknown", resp, b, http.StatusNotFound, "")
	e.api(t, "DELETE", "/sandboxes/"+id, "")
	resp, b = put(`{}`)
	wantError(t, "PUT killed", resp, b, http.StatusNotFound, "")
}
