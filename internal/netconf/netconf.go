// Package netconf validates and compiles a sandbox's network request (E2B's
// allow_internet_access and network body, PUT /sandboxes/{id}/network,
// fence's secret bindings) into what the daemon enforces: the egress
// policy, the gateway's header rules, the secret bindings and the SOCKS5
// egress proxy.
//
// # Guarantees
//
//   - Validation is E2B's (allowOut/denyOut, rules, egressProxy), with
//     E2B's messages, plus fence's extensions (ports, presets, inspect,
//     passthrough, secret bindings). A bad request is an error wrapping
//     api.ErrInvalidArgument and yields nothing.
//   - The result's Shown is what the API may show: the request normalised,
//     without the egress proxy's password. The password is only in Proxy,
//     which stays in daemon memory.
//   - The egress proxy's address must resolve, and every address must be
//     one a sandbox could reach under any policy (not never-reachable,
//     not private, not the host's); the stack checks again on every dial.
//
// # Defaults
//
// A create that says nothing about its egress (no allow_internet_access,
// no allowOut, denyOut, rules or egressProxy) gets the daemon's default
// (deny all unless fence serve --allow-internet). Anything else follows
// E2B: allowOut entries are exceptions to denyOut and the default is open.
// A PUT network always follows E2B: it replaces everything, and an
// omitted deny list re-opens traffic.
package netconf

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/gateway"
)

// Limits on a network request. Those of rules are E2B's.
const (
	MaxListEntries      = 1000 // allowOut + denyOut
	MaxRuleDomains      = 10
	MaxRuleDomainLen    = 128
	MaxRulesPerDomain   = 1
	MaxHeadersPerRule   = 20
	MaxHeaderNameLen    = 64
	MaxHeaderValueLen   = 2048
	MaxSecretsPerDomain = 32
	MaxProxyCredential  = 255
	MaxPassthrough      = 100
	MaxBindings         = 32
	MaxBindingHosts     = 32
	maxSecretNameLen    = 128
	proxyLookupTimeout  = 5 * time.Second
)

// ApprovalAsk is the network approval that holds a lookup of a name the
// policy does not allow for a person's decision.
const ApprovalAsk = "ask"

// Defaults are the daemon's side of the compilation.
type Defaults struct {
	// AllowInternet is the egress of a create that says nothing about it.
	AllowInternet bool
	// HostAddrs, Hosts and Never are the host's own addresses and the
	// operator's never-reachable ranges (policy.Spec).
	HostAddrs []netip.Addr
	Hosts     policy.HostSet
	Never     []netip.Prefix
	// Lookup resolves the egress proxy's host; nil means
	// net.DefaultResolver.
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
}

// Request is one create's or PUT's network input.
type Request struct {
	AllowInternetAccess *bool
	Network             *api.NetworkConfig
	// Secrets and EnvVars are the create's (nil for a PUT).
	Secrets map[string]api.SecretBinding
	EnvVars map[string]string
	// Update marks a PUT /sandboxes/{id}/network: E2B's defaults apply
	// even when it says nothing (an empty update re-opens traffic).
	Update bool
}

// Binding is one validated secret binding; the caller adds the
// placeholder.
type Binding struct {
	Env    string        // the variable
	Secret string        // the secret's name or sec_ ID, lower-cased
	Hosts  []string      // normalised host patterns
	Places gateway.Place // at least one place
}

// Config is a compiled network request.
type Config struct {
	// Policy is the egress policy.
	Policy *policy.Policy
	// Rules are the header transforms for gateway.Config.Rules: normalised
	// host pattern → header name → value (nil when there are none).
	Rules map[string]map[string]string
	// RuleSecrets are, per host pattern, the distinct secret names the
	// rule's values reference (lower-case).
	RuleSecrets map[string][]string
	// Inspect is the request's choice, nil for the daemon's default.
	Inspect *bool
	// Passthrough are normalised host patterns never intercepted.
	Passthrough []string
	// Proxy is the SOCKS5 egress proxy, nil for direct connections.
	Proxy *egress.Proxy
	// Bindings are the validated secret bindings, sorted by Env.
	Bindings []Binding
	// Ask holds a lookup of a name the policy does not allow for a
	// person's decision (network approval "ask").
	Ask bool
	// Shown is what the API shows of the request's network (nil when it
	// gave none): normalised, without the proxy's password.
	Shown *api.NetworkConfig
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), api.ErrInvalidArgument)
}

// SaysNothing reports whether a create leaves its egress to the daemon's
// default: no allow_internet_access and no allowOut, denyOut, rules or
// egressProxy. Ingress fields and fence's inspect/passthrough say nothing
// about what is reachable.
func SaysNothing(allowInternet *bool, n *api.NetworkConfig) bool {
	return allowInternet == nil && (n == nil ||
		len(n.AllowOut)+len(n.DenyOut)+len(n.Rules) == 0 && n.EgressProxy == nil)
}

// Compile validates r and compiles it. It resolves the egress proxy's
// host, if any.
func Compile(ctx context.Context, d Defaults, r Request) (*Config, error) {
	n := r.Network
	if n != nil && len(n.AllowOut)+len(n.DenyOut) > MaxListEntries {
		return nil, invalid("network has more than %d allowOut/denyOut entries", MaxListEntries)
	}
	allow := r.AllowInternetAccess
	if !r.Update && SaysNothing(allow, n) {
		allow = &d.AllowInternet
	}
	spec, err := policy.FromE2B(allow, n)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, api.ErrInvalidArgument)
	}
	spec.HostAddrs, spec.Hosts, spec.Never = d.HostAddrs, d.Hosts, d.Never
	pol, err := policy.Compile(spec)
	if err != nil {
		return nil, invalid("network: %v", err)
	}
	c := &Config{Policy: pol}
	if n != nil {
		if c.Rules, c.RuleSecrets, err = compileRules(n.Rules); err != nil {
			return nil, err
		}
		if c.Passthrough, err = patterns("passthrough", n.Passthrough, MaxPassthrough); err != nil {
			return nil, err
		}
		switch n.Approval {
		case "":
		case ApprovalAsk:
			c.Ask = true
		default:
			return nil, invalid("network approval %q: want %q or nothing", n.Approval, ApprovalAsk)
		}
		if n.Inspect != nil {
			c.Inspect = new(bool)
			*c.Inspect = *n.Inspect
		}
		if n.EgressProxy != nil {
			if c.Proxy, err = compileProxy(ctx, d, n.EgressProxy); err != nil {
				return nil, err
			}
		}
		c.Shown = shown(n, c)
	}
	if c.Bindings, err = compileBindings(r.Secrets, r.EnvVars); err != nil {
		return nil, err
	}
	return c, nil
}

// shown is the network as the API shows it.
func shown(n *api.NetworkConfig, c *Config) *api.NetworkConfig {
	s := &api.NetworkConfig{
		AllowOut:           slices.Clone(n.AllowOut),
		DenyOut:            slices.Clone(n.DenyOut),
		AllowPublicTraffic: n.AllowPublicTraffic,
		MaskRequestHost:    n.MaskRequestHost,
		Inspect:            c.Inspect,
		Passthrough:        c.Passthrough,
		Approval:           n.Approval,
	}
	if len(n.Rules) > 0 {
		s.Rules = make(map[string][]api.NetworkRule, len(n.Rules))
		for k, rs := range n.Rules {
			key, _ := policy.NormalizePattern(k)
			out := make([]api.NetworkRule, len(rs))
			for i, rule := range rs {
				if rule.Transform != nil {
					out[i].Transform = &api.NetworkTransform{Headers: maps.Clone(rule.Transform.Headers)}
				}
			}
			s.Rules[key] = out
		}
	}
	if c.Proxy != nil {
		s.EgressProxy = &api.EgressProxy{Address: c.Proxy.Address, Username: c.Proxy.Username}
	}
	return s
}

// Redacted returns a copy of n without the egress proxy's password (nil
// for nil): the only form of a network config that may be shown or
// stored.
func Redacted(n *api.NetworkConfig) *api.NetworkConfig {
	if n == nil {
		return nil
	}
	c := *n
	if n.EgressProxy != nil {
		c.EgressProxy = &api.EgressProxy{Address: n.EgressProxy.Address, Username: n.EgressProxy.Username}
	}
	return &c
}

func patterns(field string, list []string, max int) ([]string, error) {
	if len(list) > max {
		return nil, invalid("%s has %d entries, at most %d are allowed", field, len(list), max)
	}
	var out []string
	for _, s := range list {
		p, err := policy.NormalizePattern(strings.TrimSpace(s))
		if err != nil || p == "*" {
			return nil, invalid("%s entry %q is not a host name or *.wildcard", field, s)
		}
		out = append(out, p)
	}
	return out, nil
}

// bindingHosts validates a binding's hosts: each a name or *.wildcard,
// optionally with one port ("api.example.com:8443"); without a port it
// means the scheme's (443 for https). Entries come back normalised
// ("name" or "name:port").
func bindingHosts(field string, list []string) ([]string, error) {
	if len(list) > MaxBindingHosts {
		return nil, invalid("%s has %d entries, at most %d are allowed", field, len(list), MaxBindingHosts)
	}
	var out []string
	for _, s := range list {
		h := strings.TrimSpace(s)
		port := ""
		if i := strings.LastIndexByte(h, ':'); i >= 0 {
			h, port = h[:i], h[i+1:]
			n, err := strconv.ParseUint(port, 10, 16)
			if err != nil || n == 0 || strconv.FormatUint(n, 10) != port {
				return nil, invalid("%s entry %q: the port must be a number from 1 to 65535 (host or host:port)", field, trunc(s))
			}
		}
		p, err := policy.NormalizePattern(h)
		if err != nil || p == "*" {
			return nil, invalid("%s entry %q is not a host name or *.wildcard, optionally with :port", field, trunc(s))
		}
		if port != "" {
			p += ":" + port
		}
		out = append(out, p)
	}
	return out, nil
}

// ruleKey validates a rules key: an exact DNS name or "*."+name, at most
// 128 characters, lower-cased.
func ruleKey(k string) (string, error) {
	if len(k) > MaxRuleDomainLen {
		return "", invalid("network rule domain %q is longer than %d characters", trunc(k), MaxRuleDomainLen)
	}
	p, err := policy.NormalizePattern(k)
	if err != nil || p == "*" || strings.HasSuffix(k, ".") {
		return "", invalid("network rule domain %q is not a DNS name or a *.wildcard", trunc(k))
	}
	return p, nil
}

func compileRules(rules map[string][]api.NetworkRule) (map[string]map[string]string, map[string][]string, error) {
	if len(rules) == 0 {
		return nil, nil, nil
	}
	if len(rules) > MaxRuleDomains {
		return nil, nil, invalid("network rules name %d domains, at most %d are allowed", len(rules), MaxRuleDomains)
	}
	out := make(map[string]map[string]string, len(rules))
	secrets := map[string][]string{}
	for _, k := range slices.Sorted(maps.Keys(rules)) {
		key, err := ruleKey(k)
		if err != nil {
			return nil, nil, err
		}
		if _, dup := out[key]; dup {
			return nil, nil, invalid("network rules name the domain %q twice", key)
		}
		list := rules[k]
		if len(list) > MaxRulesPerDomain {
			return nil, nil, invalid("network rules for %q: %d rules, at most %d is allowed", key, len(list), MaxRulesPerDomain)
		}
		headers := map[string]string{}
		names := map[string]bool{}
		for _, rule := range list {
			if rule.Transform == nil {
				continue
			}
			if len(rule.Transform.Headers) > MaxHeadersPerRule {
				return nil, nil, invalid("network rule for %q sets %d headers, at most %d are allowed", key, len(rule.Transform.Headers), MaxHeadersPerRule)
			}
			for name, value := range rule.Transform.Headers {
				if !validToken(name) || len(name) > MaxHeaderNameLen {
					return nil, nil, invalid("network rule for %q: header name %q is not a valid HTTP token of at most %d characters", key, trunc(name), MaxHeaderNameLen)
				}
				if !validHeaderValue(value) || len(value) > MaxHeaderValueLen {
					return nil, nil, invalid("network rule for %q: the value of header %q is not a valid header value of at most %d characters", key, name, MaxHeaderValueLen)
				}
				refs, err := Placeholders(value)
				if err != nil {
					return nil, nil, err
				}
				for _, s := range refs {
					names[s] = true
				}
				headers[name] = value
			}
		}
		if len(names) > MaxSecretsPerDomain {
			return nil, nil, invalid("network rules for %q reference %d secrets, at most %d are allowed", key, len(names), MaxSecretsPerDomain)
		}
		out[key] = headers
		if len(names) > 0 {
			secrets[key] = slices.Sorted(maps.Keys(names))
		}
	}
	if len(secrets) == 0 {
		secrets = nil
	}
	return out, secrets, nil
}

// ErrMalformedPlaceholder is E2B's answer to a header value with a broken
// ${e2b.…} placeholder.
const ErrMalformedPlaceholder = "Network transform header contains a malformed E2B placeholder."

const (
	placeholderOpen   = "${e2b."
	secretsKind       = "secrets."
	identityTokenKind = "identity.tokens."
)

// Placeholders returns the secret names (lower-cased) that value
// references as ${e2b.secrets.NAME}. A placeholder with no closing brace,
// an empty name, another placeholder inside, or an unknown kind is
// malformed; ${e2b.identity.tokens.NAME} is refused because fence has no
// workload identity. Any other text is literal.
func Placeholders(value string) ([]string, error) {
	var names []string
	rest := value
	for {
		i := strings.Index(rest, placeholderOpen)
		if i < 0 {
			return names, nil
		}
		rest = rest[i+len(placeholderOpen):]
		end := strings.IndexByte(rest, '}')
		if end < 0 || strings.Contains(rest[:end], "${") {
			return nil, invalid("%s", ErrMalformedPlaceholder)
		}
		body := rest[:end]
		rest = rest[end+1:]
		switch {
		case strings.HasPrefix(body, identityTokenKind):
			return nil, invalid("network transform header uses ${e2b.identity.tokens.…}: workload identity tokens are not supported by fence")
		case strings.HasPrefix(body, secretsKind):
			name := strings.ToLower(strings.TrimPrefix(body, secretsKind))
			if !validSecretName(name) {
				return nil, invalid("%s", ErrMalformedPlaceholder)
			}
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		default:
			return nil, invalid("%s", ErrMalformedPlaceholder)
		}
	}
}

// validSecretName reports whether s (lower-cased) is a secret name: 1 to
// 128 bytes of [a-z0-9_-], not starting with "sec_".
func validSecretName(s string) bool {
	if s == "" || len(s) > maxSecretNameLen || strings.HasPrefix(s, "sec_") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// validSecretID reports whether s (lower-cased) is a secret ID: "sec_"
// and 26 characters of the typeid alphabet (Crockford base32, lower-case,
// the first at most '7').
func validSecretID(s string) bool {
	suffix, ok := strings.CutPrefix(s, "sec_")
	if !ok || len(suffix) != 26 || suffix[0] > '7' {
		return false
	}
	for i := 0; i < len(suffix); i++ {
		if !strings.ContainsRune("0123456789abcdefghjkmnpqrstvwxyz", rune(suffix[i])) {
			return false
		}
	}
	return true
}

// validToken reports whether s is an HTTP token (RFC 9110).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// validHeaderValue reports whether s is a header field value: visible
// characters, spaces, tabs and obs-text; no control characters, CR or LF.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// compileProxy validates an egress proxy and checks where it resolves.
func compileProxy(ctx context.Context, d Defaults, ep *api.EgressProxy) (*egress.Proxy, error) {
	bad := func(format string, args ...any) error {
		return invalid("Invalid egress proxy config: %s", fmt.Sprintf(format, args...))
	}
	host, portStr, err := net.SplitHostPort(strings.TrimSpace(ep.Address))
	if err != nil || host == "" {
		return nil, bad("address %q is not host:port", trunc(ep.Address))
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, bad("address %q has no valid port", trunc(ep.Address))
	}
	if len(ep.Username) > MaxProxyCredential || len(ep.Password) > MaxProxyCredential {
		return nil, bad("username and password must be at most %d bytes", MaxProxyCredential)
	}
	if ep.Password != "" && ep.Username == "" {
		return nil, bad("a password needs a username")
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return nil, bad("address %q has a zone", trunc(ep.Address))
		}
		addrs = []netip.Addr{a.Unmap()}
		host = a.Unmap().String()
	} else {
		name, ok := policy.NormalizeName(host)
		if !ok {
			return nil, bad("host %q is not an address or a DNS name", trunc(host))
		}
		host = name
		lookup := d.Lookup
		if lookup == nil {
			lookup = func(ctx context.Context, h string) ([]netip.Addr, error) {
				return net.DefaultResolver.LookupNetIP(ctx, "ip", h)
			}
		}
		lctx, cancel := context.WithTimeout(ctx, proxyLookupTimeout)
		addrs, err = lookup(lctx, host)
		cancel()
		if err != nil || len(addrs) == 0 {
			return nil, bad("host %q does not resolve", host)
		}
	}
	reachable, err := proxyReachable(d)
	if err != nil {
		return nil, bad("%v", err)
	}
	for _, a := range addrs {
		if !reachable(a) {
			return nil, bad("%s is an internal address", a)
		}
	}
	return &egress.Proxy{
		Address:  net.JoinHostPort(host, strconv.FormatUint(port, 10)),
		Username: ep.Username,
		Password: ep.Password,
		Allowed:  reachable,
		Lookup:   d.Lookup,
	}, nil
}

// proxyReachable is the check of the proxy's addresses: what an allow-all
// policy without private CIDR rules reaches (no never-reachable, private
// or host address).
func proxyReachable(d Defaults) (func(netip.Addr) bool, error) {
	p, err := policy.Compile(policy.Spec{AllowAll: true, HostAddrs: d.HostAddrs, Hosts: d.Hosts, Never: d.Never})
	if err != nil {
		return nil, err
	}
	return p.Reachable, nil
}

var placeNames = map[string]gateway.Place{
	"header":    gateway.PlaceHeader,
	"query":     gateway.PlaceQuery,
	"basicauth": gateway.PlaceBasicAuth,
}

// validEnvName reports whether s is [A-Za-z_][A-Za-z0-9_]*.
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func compileBindings(secrets map[string]api.SecretBinding, env map[string]string) ([]Binding, error) {
	if len(secrets) > MaxBindings {
		return nil, invalid("secrets has %d bindings, at most %d are allowed", len(secrets), MaxBindings)
	}
	var out []Binding
	for _, name := range slices.Sorted(maps.Keys(secrets)) {
		sb := secrets[name]
		if !validEnvName(name) {
			return nil, invalid("secrets: %q is not a valid environment variable name", trunc(name))
		}
		if _, dup := env[name]; dup {
			return nil, invalid("secrets: %q is also in envVars", name)
		}
		ref := strings.ToLower(strings.TrimSpace(sb.Secret))
		if strings.HasPrefix(ref, "sec_") {
			if !validSecretID(ref) {
				return nil, invalid("secrets: %s: %q is not a valid secret ID", name, trunc(sb.Secret))
			}
		} else if !validSecretName(ref) {
			return nil, invalid("secrets: %s: %q is not a valid secret name", name, trunc(sb.Secret))
		}
		if len(sb.Hosts) == 0 {
			return nil, invalid("secrets: %s: hosts must name at least one host", name)
		}
		hosts, err := bindingHosts("secrets: "+name+": hosts", sb.Hosts)
		if err != nil {
			return nil, err
		}
		var places gateway.Place
		for _, p := range sb.Places {
			pl, ok := placeNames[strings.ToLower(p)]
			if !ok {
				return nil, invalid("secrets: %s: place %q is not one of header, query, basicAuth", name, trunc(p))
			}
			places |= pl
		}
		out = append(out, Binding{Env: name, Secret: ref, Hosts: hosts, Places: cmp.Or(places, gateway.PlaceHeader)})
	}
	return out, nil
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
