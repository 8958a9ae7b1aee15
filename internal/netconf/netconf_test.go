package netconf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/gateway"
)

var zone = map[string][]string{
	"proxy.example":    {"198.51.100.5"},
	"proxy6.example":   {"2001:4860::5"},
	"internal.example": {"10.0.0.5"},
	"mixed.example":    {"198.51.100.5", "127.0.0.1"},
	"meta.example":     {"169.254.169.254"},
	"host.example":     {"198.51.100.77"},
}

func defaults() Defaults {
	return Defaults{
		HostAddrs: []netip.Addr{netip.MustParseAddr("198.51.100.77")},
		Lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
			var out []netip.Addr
			for _, s := range zone[host] {
				out = append(out, netip.MustParseAddr(s))
			}
			if len(out) == 0 {
				return nil, errors.New("no such host")
			}
			return out, nil
		},
	}
}

func rules(domain string, headers map[string]string) map[string][]api.NetworkRule {
	return map[string][]api.NetworkRule{domain: {{Transform: &api.NetworkTransform{Headers: headers}}}}
}

func deny() []string { return []string{"0.0.0.0/0"} }

func TestInvalid(t *testing.T) {
	long := strings.Repeat("abcdefgh.", 14) + "example" // 133 characters
	many := map[string][]api.NetworkRule{}
	for i := range 11 {
		many[fmt.Sprintf("h%d.example", i)] = nil
	}
	manyHeaders := map[string]string{}
	for i := range 21 {
		manyHeaders[fmt.Sprintf("X-H%d", i)] = "v"
	}
	manySecrets := map[string]string{}
	for i := range 11 { // 33 names in 11 headers
		manySecrets[fmt.Sprintf("X-S%d", i)] = fmt.Sprintf("${e2b.secrets.a%d} ${e2b.secrets.b%d} ${e2b.secrets.c%d}", i, i, i)
	}
	manyBindings := map[string]api.SecretBinding{}
	for i := range 33 {
		manyBindings[fmt.Sprintf("K%d", i)] = api.SecretBinding{Secret: "k", Hosts: []string{"a.example"}}
	}
	f := false
	tests := []struct {
		what string
		req  Request
		msg  string
	}{
		{"denied domain", Request{Network: &api.NetworkConfig{DenyOut: []string{"example.com"}}}, "invalid denied CIDR example.com"},
		{"denied unspecified", Request{Network: &api.NetworkConfig{DenyOut: []string{"0.0.0.0"}}}, "invalid denied CIDR 0.0.0.0"},
		{"allowed unspecified", Request{Network: &api.NetworkConfig{AllowOut: []string{"::"}, DenyOut: deny()}}, "invalid allowed CIDR ::"},
		{"domains need deny-all", Request{Network: &api.NetworkConfig{AllowOut: []string{"example.com"}}},
			"When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic."},
		{"domains need deny-all, even with false", Request{AllowInternetAccess: &f, Network: &api.NetworkConfig{AllowOut: []string{"example.com"}}},
			"you must include 'ALL_TRAFFIC'"},
		{"unknown preset", Request{Network: &api.NetworkConfig{AllowOut: []string{"@cpan"}, DenyOut: deny()}}, "unknown preset"},
		{"too many entries", Request{Network: &api.NetworkConfig{DenyOut: make([]string, 1001)}}, "more than 1000"},
		// rules
		{"11 domains", Request{Network: &api.NetworkConfig{Rules: many}}, "at most 10"},
		{"long domain", Request{Network: &api.NetworkConfig{Rules: rules(long, nil)}}, "longer than 128"},
		{"bare star", Request{Network: &api.NetworkConfig{Rules: rules("*", nil)}}, "not a DNS name"},
		{"not a name", Request{Network: &api.NetworkConfig{Rules: rules("a b", nil)}}, "not a DNS name"},
		{"an address", Request{Network: &api.NetworkConfig{Rules: rules("1.2.3.4", nil)}}, "not a DNS name"},
		{"two rules", Request{Network: &api.NetworkConfig{Rules: map[string][]api.NetworkRule{"a.example": {{}, {}}}}}, "at most 1 is allowed"},
		{"duplicate after lower-casing", Request{Network: &api.NetworkConfig{Rules: map[string][]api.NetworkRule{"a.example": nil, "A.example": nil}}}, "twice"},
		{"21 headers", Request{Network: &api.NetworkConfig{Rules: rules("a.example", manyHeaders)}}, "at most 20"},
		{"header name", Request{Network: &api.NetworkConfig{Rules: rules("a.example", map[string]string{"X Bad": "v"})}}, "not a valid HTTP token"},
		{"long header name", Request{Network: &api.NetworkConfig{Rules: rules("a.example", map[string]string{strings.Repeat("x", 65): "v"})}}, "not a valid HTTP token"},
		{"header value CRLF", Request{Network: &api.NetworkConfig{Rules: rules("a.example", map[string]string{"X": "a\r\nEvil: 1"})}}, "not a valid header value"},
		{"long header value", Request{Network: &api.NetworkConfig{Rules: rules("a.example", map[string]string{"X": strings.Repeat("v", 2049)})}}, "not a valid header value"},
		{"unclosed placeholder", Request{Network: &api.NetworkConfig{Rules: rules("a.example", map[string]string{"X": "Bearer ${e2b.secrets.key"})}}, ErrMalformedPlaceholder},
		{"empty name", Request{Network: &api.NetworkConfig{Rules: rules("a.example", map[string]string{"X": "${e2b.secrets.}"})}}, ErrMalformedPlaceholder},
		{"nested", Request{Network: &api.NetworkConfig{Rules: rules("a.example", map[string]string{"X": "${e2b.secrets.${e2b.secrets.a}}"})}}, ErrMalformedPlaceholder},
		{"unknown kind", Request{Network: &api.NetworkConfig{Rules: rules("a.example", map[string]string{"X": "${e2b.foo}"})}}, ErrMalformedPlaceholder},
		{"bad secret name", Request{Network: &api.NetworkConfig{Rules: rules("a.example", map[string]string{"X": "${e2b.secrets.a b}"})}}, ErrMalformedPlaceholder},
		{"identity token", Request{Network: &api.NetworkConfig{Rules: rules("a.example", map[string]string{"X": "Bearer ${e2b.identity.tokens.aws}"})}}, "not supported by fence"},
		{"33 secrets", Request{Network: &api.NetworkConfig{Rules: rules("a.example", manySecrets)}}, "reference 33 secrets, at most 32"},
		// egress proxy
		{"proxy no port", Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: "proxy.example"}}}, "Invalid egress proxy config: "},
		{"proxy bad port", Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: "proxy.example:0"}}}, "Invalid egress proxy config: "},
		{"proxy long user", Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: "proxy.example:1080", Username: strings.Repeat("u", 256)}}}, "Invalid egress proxy config: "},
		{"proxy long password", Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: "proxy.example:1080", Username: "u", Password: strings.Repeat("p", 256)}}}, "Invalid egress proxy config: "},
		{"proxy password alone", Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: "proxy.example:1080", Password: "p"}}}, "Invalid egress proxy config: a password needs a username"},
		{"proxy unresolvable", Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: "nx.example:1080"}}}, "does not resolve"},
		{"proxy private", Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: "internal.example:1080"}}}, "internal address"},
		{"proxy loopback among others", Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: "mixed.example:1080"}}}, "internal address"},
		{"proxy metadata", Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: "meta.example:1080"}}}, "internal address"},
		{"proxy the host", Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: "host.example:1080"}}}, "internal address"},
		{"proxy loopback literal", Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: "127.0.0.1:1080"}}}, "internal address"},
		{"proxy 10/8 literal", Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: "[::ffff:10.1.2.3]:1080"}}}, "internal address"},
		// passthrough
		{"passthrough star", Request{Network: &api.NetworkConfig{Passthrough: []string{"*"}}}, "passthrough entry"},
		{"passthrough bad", Request{Network: &api.NetworkConfig{Passthrough: []string{"a..b"}}}, "passthrough entry"},
		// bindings
		{"env name", Request{Secrets: map[string]api.SecretBinding{"1KEY": {Secret: "k", Hosts: []string{"a.example"}}}}, "not a valid environment variable name"},
		{"env name dash", Request{Secrets: map[string]api.SecretBinding{"MY-KEY": {Secret: "k", Hosts: []string{"a.example"}}}}, "not a valid environment variable name"},
		{"also in envVars", Request{EnvVars: map[string]string{"KEY": "x"}, Secrets: map[string]api.SecretBinding{"KEY": {Secret: "k", Hosts: []string{"a.example"}}}}, "also in envVars"},
		{"secret name", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "a b", Hosts: []string{"a.example"}}}}, "not a valid secret name"},
		{"secret id", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "sec_123", Hosts: []string{"a.example"}}}}, "not a valid secret ID"},
		{"no hosts", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "k"}}}, "at least one host"},
		{"bad host", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "k", Hosts: []string{"*"}}}}, "hosts entry"},
		{"bad port", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "k", Hosts: []string{"a.example:99999"}}}}, "port must be a number from 1 to 65535"},
		{"port zero", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "k", Hosts: []string{"a.example:0"}}}}, "port must be"},
		{"empty port", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "k", Hosts: []string{"a.example:"}}}}, "port must be"},
		{"port range", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "k", Hosts: []string{"a.example:443-444"}}}}, "port must be"},
		{"port list", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "k", Hosts: []string{"a.example:80,443"}}}}, "port must be"},
		{"signed port", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "k", Hosts: []string{"a.example:+443"}}}}, "port must be"},
		{"address with port", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "k", Hosts: []string{"10.0.0.1:443"}}}}, "hosts entry"},
		{"bare port", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "k", Hosts: []string{":443"}}}}, "hosts entry"},
		{"bad place", Request{Secrets: map[string]api.SecretBinding{"KEY": {Secret: "k", Hosts: []string{"a.example"}, Places: []string{"body"}}}}, "not one of header, query, basicAuth"},
		{"33 bindings", Request{Secrets: manyBindings}, "at most 32"},
	}
	for _, tt := range tests {
		c, err := Compile(t.Context(), defaults(), tt.req)
		if err == nil || !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: Compile = %v, %v; want an invalid-argument error containing %q", tt.what, c, err, tt.msg)
		}
	}
}

func TestRulesAndShown(t *testing.T) {
	n := &api.NetworkConfig{
		AllowOut: []string{"api.example.com", "@pypi"},
		DenyOut:  deny(),
		Rules: map[string][]api.NetworkRule{
			"API.Example.com": {{Transform: &api.NetworkTransform{Headers: map[string]string{
				"Authorization": "Bearer ${e2b.secrets.OpenAI-Key}",
				"X-Two":         "${e2b.secrets.a}${e2b.secrets.b} and ${e2b.secrets.a}",
				"X-Literal":     "${not.e2b} $ {e2b.secrets.x}",
			}}}},
			"*.example.org": {{Transform: nil}},
			"empty.example": {{Transform: &api.NetworkTransform{}}},
		},
		EgressProxy:        &api.EgressProxy{Address: "Proxy.Example:1080", Username: "alice", Password: "hunter2"},
		AllowPublicTraffic: new(bool),
		Passthrough:        []string{"Pinned.Example"},
	}
	c, err := Compile(t.Context(), defaults(), Request{Network: n})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Rules["api.example.com"]["Authorization"]; got != "Bearer ${e2b.secrets.OpenAI-Key}" {
		t.Errorf("rule value = %q", got)
	}
	if _, ok := c.Rules["*.example.org"]; !ok || len(c.Rules) != 3 {
		t.Errorf("rules = %v, want 3 domains lower-cased", c.Rules)
	}
	if got := fmt.Sprint(c.RuleSecrets["api.example.com"]); got != "[a b openai-key]" {
		t.Errorf("rule secrets = %s, want [a b openai-key]", got)
	}
	if c.Proxy == nil || c.Proxy.Address != "proxy.example:1080" || c.Proxy.Password != "hunter2" || c.Proxy.Allowed == nil {
		t.Errorf("proxy = %+v", c.Proxy)
	}
	if fmt.Sprint(c.Passthrough) != "[pinned.example]" {
		t.Errorf("passthrough = %v", c.Passthrough)
	}
	b, _ := json.Marshal(c.Shown)
	if strings.Contains(string(b), "hunter2") || strings.Contains(string(b), "password") {
		t.Errorf("shown = %s: holds the password", b)
	}
	for _, want := range []string{`"egressProxy":{"address":"proxy.example:1080","username":"alice"}`, `"api.example.com"`, `"allowPublicTraffic":false`, `"@pypi"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("shown = %s, want it to contain %s", b, want)
		}
	}
	if d := c.Policy.Decide(policy.Flow{Proto: policy.TCP, Dst: netip.MustParseAddrPort("198.51.100.9:443"), Names: []string{"files.pythonhosted.org"}}); !d.Allow {
		t.Errorf("@pypi name not allowed: %+v", d)
	}
	// Redacted never holds a password either.
	r := Redacted(n)
	if r.EgressProxy.Password != "" || n.EgressProxy.Password != "hunter2" {
		t.Errorf("Redacted = %+v (original %+v)", r.EgressProxy, n.EgressProxy)
	}
}

func TestProxyAddressForms(t *testing.T) {
	for in, want := range map[string]string{
		"proxy.example:1080":     "proxy.example:1080",
		"PROXY.example.:1080":    "proxy.example:1080",
		"proxy6.example:1080":    "proxy6.example:1080",
		"198.51.100.5:1080":      "198.51.100.5:1080",
		"[2001:4860::5]:1080":    "[2001:4860::5]:1080",
		"[::ffff:8.8.8.8]:1080":  "8.8.8.8:1080",
		" proxy.example:1080 ":   "proxy.example:1080",
		"proxy.example:01080":    "proxy.example:1080",
		"proxy.example:65535":    "proxy.example:65535",
		"proxy.example:9999 \t ": "proxy.example:9999",
	} {
		c, err := Compile(t.Context(), defaults(), Request{Network: &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: in}}})
		if err != nil {
			t.Errorf("proxy %q: %v", in, err)
			continue
		}
		if c.Proxy.Address != want {
			t.Errorf("proxy %q = %q, want %q", in, c.Proxy.Address, want)
		}
	}
}

func TestDefaults(t *testing.T) {
	tr, f := true, false
	dst := policy.Flow{Proto: policy.TCP, Dst: netip.MustParseAddrPort("8.8.8.8:443")}
	for _, tt := range []struct {
		what     string
		d        bool
		r        Request
		wantOpen bool
	}{
		{"says nothing, daemon deny", false, Request{}, false},
		{"says nothing, daemon allow", true, Request{}, true},
		{"ingress only says nothing", false, Request{Network: &api.NetworkConfig{AllowPublicTraffic: &f, Inspect: &tr}}, false},
		{"explicit true (js245, py245)", false, Request{AllowInternetAccess: &tr}, true},
		{"explicit false, daemon allow", true, Request{AllowInternetAccess: &f}, false},
		{"denyOut alone: E2B's open default", false, Request{Network: &api.NetworkConfig{DenyOut: []string{"1.1.1.1"}}}, true},
		{"allowOut IP alone: E2B's open default", false, Request{Network: &api.NetworkConfig{AllowOut: []string{"1.1.1.1"}}}, true},
		{"rules alone: E2B's open default", false, Request{Network: &api.NetworkConfig{Rules: rules("a.example", nil)}}, true},
		{"deny-all", true, Request{Network: &api.NetworkConfig{DenyOut: deny()}}, false},
		{"update {} re-opens", false, Request{Update: true, Network: &api.NetworkConfig{}}, true},
		{"update nil re-opens", false, Request{Update: true}, true},
		{"update false", true, Request{Update: true, AllowInternetAccess: &f, Network: &api.NetworkConfig{}}, false},
	} {
		d := defaults()
		d.AllowInternet = tt.d
		c, err := Compile(t.Context(), d, tt.r)
		if err != nil {
			t.Errorf("%s: %v", tt.what, err)
			continue
		}
		if got := c.Policy.Decide(dst).Allow; got != tt.wantOpen {
			t.Errorf("%s: 8.8.8.8 allowed = %v, want %v", tt.what, got, tt.wantOpen)
		}
	}
}

func TestBindings(t *testing.T) {
	c, err := Compile(t.Context(), defaults(), Request{
		EnvVars: map[string]string{"OTHER": "x"},
		Secrets: map[string]api.SecretBinding{
			"OPENAI_KEY": {Secret: "OpenAI-Key", Hosts: []string{"API.openai.com"}},
			"_gh":        {Secret: "SEC_01JD6Z3Y4Q5R6S7T8V9W0XABCD", Hosts: []string{"*.github.com"}, Places: []string{"query", "basicAuth"}},
			"PORTED":     {Secret: "k", Hosts: []string{" Blob.Example:8443 ", "*.cdn.example:443", "plain.example"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Binding{
		{Env: "OPENAI_KEY", Secret: "openai-key", Hosts: []string{"api.openai.com"}, Places: gateway.PlaceHeader},
		{Env: "PORTED", Secret: "k", Hosts: []string{"blob.example:8443", "*.cdn.example:443", "plain.example"}, Places: gateway.PlaceHeader},
		{Env: "_gh", Secret: "sec_01jd6z3y4q5r6s7t8v9w0xabcd", Hosts: []string{"*.github.com"}, Places: gateway.PlaceQuery | gateway.PlaceBasicAuth},
	}
	if fmt.Sprint(c.Bindings) != fmt.Sprint(want) {
		t.Errorf("bindings = %+v, want %+v", c.Bindings, want)
	}
}

func TestPlaceholders(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                             "[]",
		"${e2b.secrets.A}-${e2b.secrets.a}": "[a]",
		"x ${e2b.secrets.k1} y ${e2b.secrets.k2}": "[k1 k2]",
		"$e2b.secrets.x ${other} }":               "[]",
	} {
		got, err := Placeholders(in)
		if err != nil || fmt.Sprint(got) != want {
			t.Errorf("Placeholders(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
}
