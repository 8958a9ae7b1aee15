// Package policy decides whether a sandbox may open a network flow. It is a
// pure, compiled policy: [Compile] validates a [Spec] once, and
// [Policy.Decide] answers for one [Flow] without I/O, locks or allocation
// on the hot path, so it can run for every SYN.
//
// # What it guarantees
//
//   - Names match exactly or by an anchored wildcard: "example.com" matches
//     only example.com, "*.example.com" matches a.example.com and
//     a.b.example.com but not example.com, evilexample.com or
//     example.com.evil.test; "*" matches every name. Matching is case-insensitive and ignores one
//     trailing dot.
//   - Some destinations are never reachable, whatever the rules say:
//     unspecified, loopback, link-local (169.254.0.0/16 and fe80::/10, so
//     169.254.169.254 and the ECS credential address), cloud metadata
//     (fd00:ec2::254, 100.100.100.200), multicast, broadcast and reserved
//     ranges, Teredo, the platform endpoints of the major clouds (Azure's
//     WireServer 168.63.129.16, the IPv6 metadata addresses of AWS, GCP,
//     Oracle and Scaleway), the operator's own ranges ([Spec.Never]) and
//     the host's own addresses ([Spec.HostAddrs], [Spec.Hosts]). IPv6
//     forms that embed an IPv4 address (IPv4-mapped, NAT64, 6to4) are judged
//     by the embedded address.
//   - Private ranges (RFC 1918, CGNAT 100.64.0.0/10, 198.18.0.0/15, ULA
//     fc00::/7) are reachable only through an allow rule whose prefix lies
//     inside that private range; 0.0.0.0/0 or allow-all do not open them,
//     nor does a name that resolves into them.
//   - Rule precedence follows E2B: never-reachable, then allow rules, then
//     deny rules, then the default (allow-all or deny-all).
//   - A flow allowed only because its destination was handed out for an
//     allowed name is marked [Decision.VerifyName]: the caller must check the
//     name the client presents (TLS SNI, HTTP Host) with a second Decide that
//     sets [Flow.Observed]; that name must itself be allowed and be one of the
//     names the destination was handed out for.
//
// # What it does not do
//
// It does no DNS resolution, does not remember which addresses were handed
// out (the caller passes them in [Flow.Names]), does not parse traffic, and
// does not see inside TLS: an allowed SNI followed by a different HTTP Host
// inside the encrypted stream (domain fronting, HTTP/2 connection
// coalescing) is not detected. Non-ASCII names must be given in punycode.
package policy

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Proto is a transport protocol.
type Proto uint8

// Transport protocols.
const (
	TCP Proto = iota + 1
	UDP
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	}
	return "proto(" + strconv.Itoa(int(p)) + ")"
}

// PortRange is an inclusive range of ports.
type PortRange struct{ Lo, Hi uint16 }

// Rule names destinations: exactly one of Name and Prefix is set.
type Rule struct {
	// Name is "example.com" (exact), "*.example.com" (any name below
	// example.com, not example.com itself) or "*" (every name).
	Name string
	// Prefix is an address range; a single address is a /32 or /128.
	Prefix netip.Prefix
	// Ports restricts the rule to these ports; empty means every port.
	Ports []PortRange
}

func (r Rule) String() string {
	s := r.Name
	if s == "" {
		s = r.Prefix.String()
	}
	if len(r.Ports) > 0 {
		var ps []string
		for _, p := range r.Ports {
			if p.Lo == p.Hi {
				ps = append(ps, strconv.Itoa(int(p.Lo)))
			} else {
				ps = append(ps, fmt.Sprintf("%d-%d", p.Lo, p.Hi))
			}
		}
		s += " port " + strings.Join(ps, ",")
	}
	return s
}

// Spec is the uncompiled policy.
type Spec struct {
	// AllowAll is the default for a flow no rule matches: true allows it
	// (E2B allow_internet_access without lists), false denies it.
	AllowAll bool
	Allow    []Rule
	Deny     []Rule
	// HostAddrs are the host's own addresses; they are never reachable.
	HostAddrs []netip.Addr
	// Hosts, if set, is a live set of the host's own addresses (it may
	// change after Compile, as interfaces come and go); they are never
	// reachable. Contains is called on every decision and must be cheap.
	Hosts HostSet
	// Never are ranges the operator made never reachable: no allow rule
	// opens them.
	Never []netip.Prefix
}

// HostSet is a set of addresses that may change over time.
type HostSet interface {
	Contains(netip.Addr) bool
}

// ParseTarget parses one E2B allowOut/denyOut entry: an IP address, a CIDR,
// a name or a "*."-wildcard name. The rule covers every port.
//
// A target may end in ports: "pypi.org:443", "*.example.com:80,443",
// "10.0.0.0/8:5432-5433", "[2001:db8::/32]:443" (IPv6 in brackets when
// ports follow). Without ports a rule covers every port.
func ParseTarget(s string) (Rule, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Rule{}, errors.New("empty target")
	}
	target, ports, err := splitPorts(s)
	if err != nil {
		return Rule{}, err
	}
	r, err := parseBareTarget(target)
	if err != nil {
		return Rule{}, err
	}
	r.Ports = ports
	return r, nil
}

// splitPorts splits "target:ports" into its parts. A bare IPv6 address or
// prefix (more than one colon, no brackets) has no ports.
func splitPorts(s string) (string, []PortRange, error) {
	var host, list string
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", nil, fmt.Errorf("target %q: missing ]", s)
		}
		host, list = s[1:end], s[end+1:]
		if list == "" {
			return host, nil, nil
		}
		if !strings.HasPrefix(list, ":") {
			return "", nil, fmt.Errorf("target %q: want [address]:ports", s)
		}
		list = list[1:]
	case strings.Count(s, ":") == 1:
		host, list, _ = strings.Cut(s, ":")
	default:
		return s, nil, nil
	}
	var ports []PortRange
	for _, p := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(p, "-")
		if !isRange {
			hi = lo
		}
		l, err1 := strconv.ParseUint(lo, 10, 16)
		h, err2 := strconv.ParseUint(hi, 10, 16)
		if err1 != nil || err2 != nil || l == 0 || h < l {
			return "", nil, fmt.Errorf("target %q: bad port or range %q", s, p)
		}
		ports = append(ports, PortRange{Lo: uint16(l), Hi: uint16(h)})
	}
	return host, ports, nil
}

func parseBareTarget(s string) (Rule, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Rule{}, fmt.Errorf("parsing CIDR %q: %w", s, err)
		}
		return Rule{Prefix: p.Masked()}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return Rule{}, fmt.Errorf("address %q has a zone", s)
		}
		return Rule{Prefix: netip.PrefixFrom(a, a.BitLen())}, nil
	}
	if _, err := normalizePattern(s); err != nil {
		return Rule{}, err
	}
	return Rule{Name: s}, nil
}

// Reasons a decision was made.
const (
	ReasonNeverReachable = "never-reachable" // loopback, link-local, metadata, host, ...
	ReasonPrivate        = "private-range"   // private address not explicitly allowed by CIDR
	ReasonAllowCIDR      = "allow-cidr"
	ReasonAllowName      = "allow-name"
	ReasonDenyCIDR       = "deny-cidr"
	ReasonDenyName       = "deny-name"
	ReasonNameMismatch   = "name-mismatch" // SNI/Host not among the names handed out for the destination
	ReasonNameNotAllowed = "name-not-allowed"
	ReasonDefaultAllow   = "default-allow"
	ReasonDefaultDeny    = "default-deny"
)

// Flow is one connection attempt as the daemon sees it.
type Flow struct {
	Proto Proto
	Dst   netip.AddrPort
	// Names are the names the sandbox's resolver handed out Dst's address
	// for, still within their TTL.
	Names []string
	// Observed is the name the client presented (TLS SNI or HTTP Host), or
	// "" when it is not known (yet).
	Observed string
}

// Decision is the verdict on a flow.
type Decision struct {
	Allow  bool
	Reason string // one of the Reason constants
	Rule   string // the rule that matched, if any
	Name   string // the name that justified an allow-name decision
	// VerifyName is set when the flow is allowed before its name is known
	// and the name the client presents could still deny it: the caller must
	// peek at the stream and call Decide again with Observed set before it
	// forwards any byte from the sandbox.
	VerifyName bool
}

type nameRule struct {
	rule  string
	ports []PortRange
}

type cidrRule struct {
	prefix netip.Prefix
	ports  []PortRange
	rule   string
}

// Policy is a compiled [Spec]. It is immutable and safe for concurrent use.
type Policy struct {
	allowAll               bool
	allowExact, allowWild  map[string][]nameRule
	denyExact, denyWild    map[string][]nameRule
	allowCIDR, denyCIDR    []cidrRule
	host                   map[netip.Addr]bool
	hosts                  HostSet
	never                  []netip.Prefix
	hasAllowName, hasDenyN bool
}

// Compile validates spec and builds a Policy.
func Compile(spec Spec) (*Policy, error) {
	p := &Policy{
		allowAll:   spec.AllowAll,
		allowExact: map[string][]nameRule{}, allowWild: map[string][]nameRule{},
		denyExact: map[string][]nameRule{}, denyWild: map[string][]nameRule{},
		host: map[netip.Addr]bool{},
	}
	add := func(r Rule, exact, wild map[string][]nameRule, cidrs *[]cidrRule) error {
		for _, pr := range r.Ports {
			if pr.Lo == 0 || pr.Lo > pr.Hi {
				return fmt.Errorf("rule %v: invalid port range %d-%d", r, pr.Lo, pr.Hi)
			}
		}
		switch {
		case r.Name != "" && r.Prefix.IsValid():
			return fmt.Errorf("rule %v: both a name and a prefix", r)
		case r.Name != "":
			n, err := normalizePattern(r.Name)
			if err != nil {
				return err
			}
			nr := nameRule{rule: r.String(), ports: slices.Clone(r.Ports)}
			if n == "*" {
				wild[""] = append(wild[""], nr)
			} else if suffix, ok := strings.CutPrefix(n, "*."); ok {
				wild[suffix] = append(wild[suffix], nr)
			} else {
				exact[n] = append(exact[n], nr)
			}
		case r.Prefix.IsValid():
			pf := r.Prefix.Masked()
			if pf.Addr().Is4In6() {
				if pf.Bits() < 96 {
					return fmt.Errorf("rule %v: IPv4-mapped prefix shorter than /96", r)
				}
				pf = netip.PrefixFrom(pf.Addr().Unmap(), pf.Bits()-96)
			}
			*cidrs = append(*cidrs, cidrRule{prefix: pf, ports: slices.Clone(r.Ports), rule: r.String()})
		default:
			return errors.New("rule with neither a name nor a prefix")
		}
		return nil
	}
	for _, r := range spec.Allow {
		if err := add(r, p.allowExact, p.allowWild, &p.allowCIDR); err != nil {
			return nil, fmt.Errorf("compiling allow rule: %w", err)
		}
	}
	for _, r := range spec.Deny {
		if err := add(r, p.denyExact, p.denyWild, &p.denyCIDR); err != nil {
			return nil, fmt.Errorf("compiling deny rule: %w", err)
		}
	}
	for _, a := range spec.HostAddrs {
		if a.IsValid() {
			p.host[a.Unmap().WithZone("")] = true
		}
	}
	p.hosts = spec.Hosts
	for _, pf := range spec.Never {
		if !pf.IsValid() {
			return nil, fmt.Errorf("never-reachable range %v is not valid", pf)
		}
		if pf.Addr().Is4In6() && pf.Bits() >= 96 {
			pf = netip.PrefixFrom(pf.Addr().Unmap(), pf.Bits()-96)
		}
		p.never = append(p.never, pf.Masked())
	}
	p.hasAllowName = len(p.allowExact)+len(p.allowWild) > 0
	p.hasDenyN = len(p.denyExact)+len(p.denyWild) > 0
	return p, nil
}

// WithNames returns a copy of p that also allows names (exact names, on
// every port) as if they were allow rules; p is unchanged. Names that are
// not valid are left out.
func (p *Policy) WithNames(names []string) *Policy {
	c := *p
	c.allowExact = maps.Clone(p.allowExact)
	for _, n := range names {
		if n, ok := NormalizeName(n); ok {
			c.allowExact[n] = append(slices.Clip(c.allowExact[n]), nameRule{rule: n})
		}
	}
	c.hasAllowName = len(c.allowExact)+len(c.allowWild) > 0
	return &c
}

// AllowAll reports whether flows no rule matches are allowed.
func (p *Policy) AllowAll() bool { return p.allowAll }

// AllowName reports whether the sandbox may resolve name: it is allowed
// when it is not denied by a name rule and either matches an allow name
// rule (on any port) or the default is allow-all. Invalid names are not
// allowed.
func (p *Policy) AllowName(name string) (ok bool, reason string) {
	n, ok := NormalizeName(name)
	if !ok {
		return false, ReasonNameNotAllowed
	}
	if _, ok := matchName(p.allowExact, p.allowWild, n, 0); ok {
		return true, ReasonAllowName
	}
	if _, ok := matchName(p.denyExact, p.denyWild, n, 0); ok {
		return false, ReasonDenyName
	}
	if p.allowAll {
		return true, ReasonDefaultAllow
	}
	return false, ReasonNameNotAllowed
}

// Reachable reports whether addr may ever be a destination under this
// policy: it is not never-reachable, and if it is private an allow CIDR
// rule inside the private range covers it. A resolver uses it to reject
// answers that point an allowed name at an internal address.
func (p *Policy) Reachable(addr netip.Addr) bool {
	ok, _, _ := p.reachable(addr, 0)
	return ok
}

func (p *Policy) reachable(addr netip.Addr, port uint16) (ok bool, reason, rule string) {
	a, blocked := classify(addr)
	plain := addr.Unmap().WithZone("")
	if blocked || p.host[a] || p.host[plain] {
		return false, ReasonNeverReachable, ""
	}
	if p.hosts != nil && (p.hosts.Contains(a) || p.hosts.Contains(plain)) {
		return false, ReasonNeverReachable, ""
	}
	for _, pf := range p.never {
		if pf.Contains(a) || pf.Contains(plain) {
			return false, ReasonNeverReachable, pf.String()
		}
	}
	if priv, isPriv := privateRange(a); isPriv {
		for _, c := range p.allowCIDR {
			if c.prefix.Contains(a) && portOK(c.ports, port) &&
				c.prefix.Bits() >= priv.Bits() && priv.Contains(c.prefix.Addr()) {
				return true, ReasonAllowCIDR, c.rule
			}
		}
		return false, ReasonPrivate, ""
	}
	return true, "", ""
}

// Decide returns the verdict on f. It does no I/O.
func (p *Policy) Decide(f Flow) Decision {
	addr, port := f.Dst.Addr(), f.Dst.Port()
	ok, reason, rule := p.reachable(addr, port)
	if !ok {
		return Decision{Reason: reason}
	}
	a, _ := classify(addr)
	if reason == "" { // not private: look for an allow CIDR rule
		for _, c := range p.allowCIDR {
			if c.prefix.Contains(a) && portOK(c.ports, port) {
				reason, rule = ReasonAllowCIDR, c.rule
				break
			}
		}
	}
	if reason == ReasonAllowCIDR {
		return p.checkObservedDeny(f, Decision{Allow: true, Reason: reason, Rule: rule})
	}

	// Allowed by name: the address was handed out for an allowed name.
	if p.hasAllowName {
		if f.Observed != "" {
			if d, handled := p.decideObserved(f, addr, port); handled {
				return d
			}
		} else {
			for _, n := range f.Names {
				nn, valid := NormalizeName(n)
				if !valid {
					continue
				}
				if r, ok := matchName(p.allowExact, p.allowWild, nn, port); ok {
					return Decision{Allow: true, Reason: ReasonAllowName, Rule: r, Name: nn, VerifyName: true}
				}
			}
		}
	}

	for _, c := range p.denyCIDR {
		if c.prefix.Contains(a) && portOK(c.ports, port) {
			return Decision{Reason: ReasonDenyCIDR, Rule: c.rule}
		}
	}
	if p.allowAll {
		return p.checkObservedDeny(f, Decision{Allow: true, Reason: ReasonDefaultAllow})
	}
	return Decision{Reason: ReasonDefaultDeny}
}

// decideObserved handles a flow whose client-presented name is known.
// handled is false when the observed name carries no information (an IP
// literal equal to the destination) and the caller should go on.
func (p *Policy) decideObserved(f Flow, addr netip.Addr, port uint16) (d Decision, handled bool) {
	if ip, err := netip.ParseAddr(strings.Trim(f.Observed, "[]")); err == nil {
		if ip.Unmap() == addr.Unmap() {
			// An IP literal names the destination itself: judge by the
			// names it was handed out for.
			for _, n := range f.Names {
				nn, valid := NormalizeName(n)
				if !valid {
					continue
				}
				if r, ok := matchName(p.allowExact, p.allowWild, nn, port); ok {
					return Decision{Allow: true, Reason: ReasonAllowName, Rule: r, Name: nn}, true
				}
			}
			return Decision{}, false
		}
		return Decision{Reason: ReasonNameMismatch}, true
	}
	obs, valid := NormalizeName(f.Observed)
	if !valid {
		return Decision{Reason: ReasonNameNotAllowed}, true
	}
	r, allowed := matchName(p.allowExact, p.allowWild, obs, port)
	inNames := false
	for _, n := range f.Names {
		if nn, _ := NormalizeName(n); nn == obs {
			inNames = true
			break
		}
	}
	switch {
	case allowed && inNames:
		return Decision{Allow: true, Reason: ReasonAllowName, Rule: r, Name: obs}, true
	case allowed:
		return Decision{Reason: ReasonNameMismatch, Rule: r, Name: obs}, true
	case len(f.Names) > 0 && !p.allowAll:
		// The address came from an allowed name but the client asks
		// for another one.
		return Decision{Reason: ReasonNameNotAllowed, Name: obs}, true
	}
	return Decision{}, false
}

// checkObservedDeny turns an allow into a deny when the observed name
// matches a deny name rule; without deny name rules it returns d.
func (p *Policy) checkObservedDeny(f Flow, d Decision) Decision {
	if !p.hasDenyN {
		return d
	}
	if f.Observed == "" {
		d.VerifyName = true
		return d
	}
	if obs, ok := NormalizeName(f.Observed); ok {
		if r, ok := matchName(p.denyExact, p.denyWild, obs, f.Dst.Port()); ok {
			return Decision{Reason: ReasonDenyName, Rule: r, Name: obs}
		}
	}
	return d
}

func portOK(ports []PortRange, port uint16) bool {
	if len(ports) == 0 || port == 0 {
		return true
	}
	for _, r := range ports {
		if port >= r.Lo && port <= r.Hi {
			return true
		}
	}
	return false
}

// matchName looks name (normalised) up among exact names and then among
// wildcard suffixes at label boundaries, so matching is anchored by
// construction. port 0 matches any port rule.
func matchName(exact, wild map[string][]nameRule, name string, port uint16) (string, bool) {
	for _, r := range exact[name] {
		if portOK(r.ports, port) {
			return r.rule, true
		}
	}
	if len(wild) == 0 {
		return "", false
	}
	for i := 0; i < len(name); i++ {
		if name[i] != '.' {
			continue
		}
		for _, r := range wild[name[i+1:]] {
			if portOK(r.ports, port) {
				return r.rule, true
			}
		}
	}
	for _, r := range wild[""] { // "*": every name
		if portOK(r.ports, port) {
			return r.rule, true
		}
	}
	return "", false
}

// NormalizeName lower-cases a DNS name and strips one trailing dot. ok is
// false when the result is not a valid host name (LDH labels, underscores
// allowed, 1–63 bytes per label, at most 253 bytes).
func NormalizeName(s string) (string, bool) {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return "", false
	}
	lower := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			lower = false
			break
		}
	}
	if !lower {
		s = strings.ToLower(s)
	}
	label := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			if label == 0 {
				return "", false
			}
			label = 0
			continue
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return "", false
		}
		label++
		if label > 63 {
			return "", false
		}
	}
	if label == 0 {
		return "", false
	}
	return s, true
}

// NormalizePattern validates and lower-cases a name pattern: an exact name,
// "*.suffix", or "*" (every name).
func NormalizePattern(s string) (string, error) { return normalizePattern(s) }

func normalizePattern(s string) (string, error) {
	if s == "*" {
		return s, nil
	}
	rest, wild := strings.CutPrefix(s, "*.")
	n, ok := NormalizeName(rest)
	if !ok || strings.Contains(n, "*") {
		return "", fmt.Errorf("invalid name %q (want example.com or *.example.com, punycode for non-ASCII)", s)
	}
	if _, err := netip.ParseAddr(n); err == nil {
		return "", fmt.Errorf("invalid name %q: an address", s)
	}
	if wild {
		return "*." + n, nil
	}
	return n, nil
}
