package policy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
)

func mustCompile(t testing.TB, spec Spec) *Policy {
	t.Helper()
	p, err := Compile(spec)
	if err != nil {
		t.Fatalf("Compile(%+v): %v", spec, err)
	}
	return p
}

func rules(t testing.TB, ss ...string) []Rule {
	t.Helper()
	var rs []Rule
	for _, s := range ss {
		r, err := ParseTarget(s)
		if err != nil {
			t.Fatalf("ParseTarget(%q): %v", s, err)
		}
		rs = append(rs, r)
	}
	return rs
}

func flow(dst string, names ...string) Flow {
	return Flow{Proto: TCP, Dst: netip.MustParseAddrPort(dst), Names: names}
}

func TestDecide(t *testing.T) {
	host := netip.MustParseAddr("198.51.100.7")
	allowList := Spec{
		Allow: append(rules(t, "allowed.test", "*.wild.test", "203.0.113.0/24", "10.1.0.0/16", "fd12::/16"),
			Rule{Name: "ssh.test", Ports: []PortRange{{22, 22}}},
			Rule{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Ports: []PortRange{{443, 443}, {8000, 8100}}}),
		HostAddrs: []netip.Addr{host},
	}
	allowAll := Spec{AllowAll: true, Deny: rules(t, "198.51.100.0/24", "blocked.test"), HostAddrs: []netip.Addr{host}}
	e2b := Spec{Allow: rules(t, "1.1.1.1", "allowed.test"), Deny: rules(t, "0.0.0.0/0", "::/0")}

	tests := []struct {
		name   string
		spec   Spec
		f      Flow
		allow  bool
		reason string
		verify bool
	}{
		{"cidr", allowList, flow("203.0.113.10:443"), true, ReasonAllowCIDR, false},
		{"cidr other", allowList, flow("8.8.8.8:443"), false, ReasonDefaultDeny, false},
		{"name via dns", allowList, flow("8.8.8.8:443", "allowed.test"), true, ReasonAllowName, true},
		{"name via dns case", allowList, flow("8.8.8.8:443", "ALLOWED.test."), true, ReasonAllowName, true},
		{"name not allowed", allowList, flow("8.8.8.8:443", "evil.test"), false, ReasonDefaultDeny, false},
		{"unanchored suffix", allowList, flow("8.8.8.8:443", "evilallowed.test"), false, ReasonDefaultDeny, false},
		{"unanchored prefix", allowList, flow("8.8.8.8:443", "allowed.test.evil.test"), false, ReasonDefaultDeny, false},
		{"wildcard sub", allowList, flow("8.8.8.8:443", "a.b.wild.test"), true, ReasonAllowName, true},
		{"wildcard apex", allowList, flow("8.8.8.8:443", "wild.test"), false, ReasonDefaultDeny, false},
		{"wildcard unanchored", allowList, flow("8.8.8.8:443", "evilwild.test"), false, ReasonDefaultDeny, false},
		{"name port ok", allowList, flow("8.8.8.8:22", "ssh.test"), true, ReasonAllowName, true},
		{"name port bad", allowList, flow("8.8.8.8:443", "ssh.test"), false, ReasonDefaultDeny, false},
		{"cidr port ok", allowList, flow("192.0.2.1:8050"), true, ReasonAllowCIDR, false},
		{"cidr port bad", allowList, flow("192.0.2.1:80"), false, ReasonDefaultDeny, false},
		{"metadata", allowList, flow("169.254.169.254:80", "allowed.test"), false, ReasonNeverReachable, false},
		{"metadata mapped", allowList, flow("[::ffff:169.254.169.254]:80"), false, ReasonNeverReachable, false},
		{"metadata nat64", allowList, flow("[64:ff9b::a9fe:a9fe]:80"), false, ReasonNeverReachable, false},
		{"metadata 6to4", allowList, flow("[2002:a9fe:a9fe::1]:80"), false, ReasonNeverReachable, false},
		{"metadata v6", allowList, flow("[fd00:ec2::254]:80"), false, ReasonNeverReachable, false},
		{"alibaba", allowAll, flow("100.100.100.200:80"), false, ReasonNeverReachable, false},
		{"loopback", allowAll, flow("127.0.0.1:80"), false, ReasonNeverReachable, false},
		{"loopback v6", allowAll, flow("[::1]:80"), false, ReasonNeverReachable, false},
		{"unspecified", allowAll, flow("0.0.0.0:80"), false, ReasonNeverReachable, false},
		{"multicast", allowAll, flow("224.0.0.251:5353"), false, ReasonNeverReachable, false},
		{"broadcast", allowAll, flow("255.255.255.255:80"), false, ReasonNeverReachable, false},
		{"linklocal v6", allowAll, flow("[fe80::1%eth0]:80"), false, ReasonNeverReachable, false},
		{"teredo", allowAll, flow("[2001:0:4136:e378::1]:80"), false, ReasonNeverReachable, false},
		{"host addr", allowAll, flow("198.51.100.7:22"), false, ReasonNeverReachable, false},
		{"host addr mapped", allowAll, flow("[::ffff:198.51.100.7]:22"), false, ReasonNeverReachable, false},
		{"private default allow", allowAll, flow("10.0.0.1:80"), false, ReasonPrivate, false},
		{"private by name", allowList, flow("192.168.1.1:443", "allowed.test"), false, ReasonPrivate, false},
		{"private listed", allowList, flow("10.1.2.3:80"), true, ReasonAllowCIDR, false},
		{"private not listed", allowList, flow("10.2.2.3:80"), false, ReasonPrivate, false},
		{"ula listed", allowList, flow("[fd12::1]:80"), true, ReasonAllowCIDR, false},
		{"ula not listed", allowList, flow("[fd13::1]:80"), false, ReasonPrivate, false},
		{"cgnat", allowAll, flow("100.64.0.1:80"), false, ReasonPrivate, false},
		{"allow all", allowAll, flow("8.8.8.8:53"), true, ReasonDefaultAllow, true},
		{"allow all v6", allowAll, flow("[2606:4700::1111]:443"), true, ReasonDefaultAllow, true},
		{"deny cidr", allowAll, flow("198.51.100.8:443"), false, ReasonDenyCIDR, false},
		{"e2b allow ip over deny all", e2b, flow("1.1.1.1:443"), true, ReasonAllowCIDR, false},
		{"e2b deny all", e2b, flow("1.0.0.1:443"), false, ReasonDenyCIDR, false},
		{"e2b deny all v6", e2b, flow("[2606:4700::1111]:443"), false, ReasonDenyCIDR, false},
		{"e2b allow name over deny all", e2b, flow("1.0.0.1:443", "allowed.test"), true, ReasonAllowName, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := mustCompile(t, tt.spec).Decide(tt.f)
			if d.Allow != tt.allow || d.Reason != tt.reason || d.VerifyName != tt.verify {
				t.Errorf("Decide(%+v) = %+v, want allow=%v reason=%s verify=%v", tt.f, d, tt.allow, tt.reason, tt.verify)
			}
		})
	}
}

func TestDecideObserved(t *testing.T) {
	p := mustCompile(t, Spec{Allow: rules(t, "allowed.test", "shared.test", "*.wild.test")})
	pa := mustCompile(t, Spec{AllowAll: true, Deny: rules(t, "evil.test")})
	tests := []struct {
		p        *Policy
		names    []string
		observed string
		allow    bool
		reason   string
	}{
		{p, []string{"allowed.test"}, "allowed.test", true, ReasonAllowName},
		{p, []string{"allowed.test"}, "Allowed.Test.", true, ReasonAllowName},
		{p, []string{"allowed.test"}, "evil.test", false, ReasonNameNotAllowed},
		// SNI of another allowed name whose addresses differ: mismatch.
		{p, []string{"allowed.test"}, "shared.test", false, ReasonNameMismatch},
		{p, []string{"allowed.test", "shared.test"}, "shared.test", true, ReasonAllowName},
		{p, []string{"a.wild.test"}, "a.wild.test", true, ReasonAllowName},
		{p, nil, "allowed.test", false, ReasonNameMismatch},
		{p, []string{"allowed.test"}, "203.0.113.10", true, ReasonAllowName}, // IP literal = destination
		{p, []string{"allowed.test"}, "203.0.113.11", false, ReasonNameMismatch},
		{p, []string{"allowed.test"}, "bad name!", false, ReasonNameNotAllowed},
		{pa, nil, "evil.test", false, ReasonDenyName},
		{pa, nil, "EVIL.test.", false, ReasonDenyName},
		{pa, nil, "good.test", true, ReasonDefaultAllow},
	}
	for _, tt := range tests {
		f := Flow{Proto: TCP, Dst: netip.MustParseAddrPort("203.0.113.10:443"), Names: tt.names, Observed: tt.observed}
		d := tt.p.Decide(f)
		if d.Allow != tt.allow || d.Reason != tt.reason || d.VerifyName {
			t.Errorf("Decide(%+v) = %+v, want allow=%v reason=%s", f, d, tt.allow, tt.reason)
		}
	}
}

func TestAllowName(t *testing.T) {
	p := mustCompile(t, Spec{Allow: rules(t, "allowed.test", "*.wild.test")})
	pa := mustCompile(t, Spec{AllowAll: true, Deny: []Rule{{Name: "*.evil.test"}}})
	tests := []struct {
		p    *Policy
		name string
		want bool
	}{
		{p, "allowed.test", true},
		{p, "ALLOWED.TEST.", true},
		{p, "evilallowed.test", false},
		{p, "allowed.test.evil.test", false},
		{p, "x.allowed.test", false},
		{p, "x.wild.test", true},
		{p, "wild.test", false},
		{p, "", false},
		{p, "a..test", false},
		{pa, "anything.test", true},
		{pa, "x.evil.test", false},
		{pa, "evil.test", true},
	}
	for _, tt := range tests {
		if got, _ := tt.p.AllowName(tt.name); got != tt.want {
			t.Errorf("AllowName(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestCompileErrors(t *testing.T) {
	bad := []Spec{
		{Allow: []Rule{{}}},
		{Allow: []Rule{{Name: "a.test", Prefix: netip.MustParsePrefix("1.2.3.0/24")}}},
		{Allow: []Rule{{Name: "*.*"}}},
		{Allow: []Rule{{Name: "a.*.test"}}},
		{Allow: []Rule{{Name: "ex ample.test"}}},
		{Allow: []Rule{{Name: "bücher.test"}}},
		{Allow: []Rule{{Name: "a.test", Ports: []PortRange{{0, 10}}}}},
		{Deny: []Rule{{Name: "a.test", Ports: []PortRange{{10, 9}}}}},
	}
	for _, s := range bad {
		if _, err := Compile(s); err == nil {
			t.Errorf("Compile(%+v) = nil error, want an error", s)
		}
	}
	for _, s := range []string{"", "1.2.3.4/33", "**", "*.", "a b", "fe80::1%eth0", "1.2.3.4:80x", "a.test:1:2"} {
		if _, err := ParseTarget(s); err == nil {
			t.Errorf("ParseTarget(%q) = nil error, want an error", s)
		}
	}
}

func TestFromE2B(t *testing.T) {
	f, tr := false, true
	net := func(allow, deny []string) *api.NetworkConfig {
		return &api.NetworkConfig{AllowOut: allow, DenyOut: deny}
	}
	all := []string{"0.0.0.0/0"}
	tests := []struct {
		what     string
		allow    *bool
		net      *api.NetworkConfig
		dst      string
		names    []string
		want     bool
		allowAll bool
	}{
		{"nothing", nil, nil, "8.8.8.8:443", nil, true, true},
		{"explicit true", &tr, nil, "8.8.8.8:443", nil, true, true},
		{"false", &f, nil, "8.8.8.8:443", nil, false, false},
		{"false, ipv6", &f, nil, "[2606:4700::1111]:443", nil, false, false},
		// E2B's sandbox/network.test.ts cases.
		{"allow only 1.1.1.1: 1.1.1.1", nil, net([]string{"1.1.1.1"}, all), "1.1.1.1:80", nil, true, false},
		{"allow only 1.1.1.1: 8.8.8.8", nil, net([]string{"1.1.1.1"}, all), "8.8.8.8:80", nil, false, false},
		{"allow wins over deny: 1.1.1.1", nil, net([]string{"1.1.1.1", "8.8.8.8"}, all), "1.1.1.1:80", nil, true, false},
		{"allow wins over deny: 8.8.8.8", nil, net([]string{"1.1.1.1", "8.8.8.8"}, all), "8.8.8.8:80", nil, true, false},
		{"allow wins over the same CIDR denied", nil, net([]string{"8.8.8.8"}, []string{"8.8.8.8"}), "8.8.8.8:80", nil, true, true},
		{"deny 8.8.8.8 alone: 8.8.8.8", nil, net(nil, []string{"8.8.8.8"}), "8.8.8.8:80", nil, false, true},
		{"deny 8.8.8.8 alone: 1.1.1.1", nil, net(nil, []string{"8.8.8.8"}), "1.1.1.1:80", nil, true, true},
		{"deny a /24", nil, net(nil, []string{"8.8.8.0/24"}), "8.8.4.4:443", nil, true, true},
		// allowOut alone is not an allowlist.
		{"allowOut IP alone changes nothing", nil, net([]string{"1.1.1.1"}, nil), "8.8.8.8:80", nil, true, true},
		{"allowOut IP alone, true", &tr, net([]string{"1.1.1.1"}, nil), "8.8.8.8:80", nil, true, true},
		// allow_internet_access false replaces denyOut; allowOut still applies.
		{"false + allowOut IP: allowed", &f, net([]string{"1.1.1.1"}, nil), "1.1.1.1:443", nil, true, false},
		{"false + allowOut IP: other", &f, net([]string{"1.1.1.1"}, nil), "8.8.8.8:443", nil, false, false},
		{"false replaces a narrower deny", &f, net(nil, []string{"8.8.8.8"}), "1.1.1.1:443", nil, false, false},
		{"false + deny-all + domain: name", &f, net([]string{"allowed.test"}, all), "8.8.8.8:443", []string{"allowed.test"}, true, false},
		{"true keeps the deny list", &tr, net(nil, []string{"8.8.8.8"}), "8.8.8.8:443", nil, false, true},
		// Domains.
		{"domain under deny-all: name", nil, net([]string{"allowed.test"}, all), "8.8.8.8:443", []string{"allowed.test"}, true, false},
		{"domain under deny-all: other", nil, net([]string{"allowed.test"}, all), "8.8.8.8:443", nil, false, false},
		{"wildcard", nil, net([]string{"*.allowed.test"}, all), "8.8.8.8:443", []string{"a.allowed.test"}, true, false},
		{"wildcard is not the apex", nil, net([]string{"*.allowed.test"}, all), "8.8.8.8:443", []string{"allowed.test"}, false, false},
		{"star", nil, net([]string{"*"}, all), "8.8.8.8:443", []string{"anything.test"}, true, false},
		{"case-insensitive", nil, net([]string{"Allowed.TEST"}, all), "8.8.8.8:443", []string{"allowed.test"}, true, false},
		{"preset", nil, net([]string{"@pypi"}, all), "151.101.0.223:443", []string{"files.pythonhosted.org"}, true, false},
		// ALL_TRAFFIC also covers IPv6.
		{"deny-all ipv6", nil, net(nil, all), "[2606:4700::1111]:443", nil, false, false},
		{"allow-all wins over deny-all", nil, net(all, all), "8.8.8.8:443", nil, true, true},
		{"allow-all ipv6", nil, net(all, all), "[2606:4700::1111]:443", nil, true, true},
		// fence's extras stay.
		{"private needs a CIDR inside it", nil, net(all, nil), "10.0.0.1:443", nil, false, true},
		{"private CIDR allowed", nil, net([]string{"10.0.0.0/24"}, all), "10.0.0.1:443", nil, true, false},
		{"metadata never", nil, net([]string{"169.254.169.254"}, all), "169.254.169.254:80", nil, false, false},
		{"ports", nil, net([]string{"1.1.1.1:443"}, all), "1.1.1.1:80", nil, false, false},
		{"deny with ports", nil, net(nil, []string{"0.0.0.0/0:25"}), "1.1.1.1:25", nil, false, true},
		{"deny with ports, other port", nil, net(nil, []string{"0.0.0.0/0:25"}), "1.1.1.1:443", nil, true, true},
	}
	for _, tt := range tests {
		spec, err := FromE2B(tt.allow, tt.net)
		if err != nil {
			t.Fatalf("%s: FromE2B: %v", tt.what, err)
		}
		p := mustCompile(t, spec)
		if p.AllowAll() != tt.allowAll {
			t.Errorf("%s: AllowAll = %v, want %v", tt.what, p.AllowAll(), tt.allowAll)
		}
		if d := p.Decide(flow(tt.dst, tt.names...)); d.Allow != tt.want {
			t.Errorf("%s: Decide(%s, %v) = %+v, want allow=%v", tt.what, tt.dst, tt.names, d, tt.want)
		}
	}
	// Names resolve only where a flow to them could be allowed.
	spec, _ := FromE2B(nil, net([]string{"allowed.test"}, all))
	p := mustCompile(t, spec)
	if ok, _ := p.AllowName("allowed.test"); !ok {
		t.Errorf("AllowName(allowed.test) under deny-all + allowOut = false")
	}
	if ok, _ := p.AllowName("other.test"); ok {
		t.Errorf("AllowName(other.test) under deny-all = true")
	}
}

func TestFromE2BInvalid(t *testing.T) {
	f := false
	net := func(allow, deny []string) *api.NetworkConfig {
		return &api.NetworkConfig{AllowOut: allow, DenyOut: deny}
	}
	tests := []struct {
		allow *bool
		net   *api.NetworkConfig
		msg   string
	}{
		{nil, net(nil, []string{"example.com"}), "invalid denied CIDR example.com"},
		{nil, net(nil, []string{"*.example.com"}), "invalid denied CIDR *.example.com"},
		{nil, net(nil, []string{"0.0.0.0"}), "invalid denied CIDR 0.0.0.0"},
		{nil, net(nil, []string{"0.0.0.0/8"}), "invalid denied CIDR 0.0.0.0/8"},
		{nil, net(nil, []string{"::"}), "invalid denied CIDR ::"},
		{nil, net(nil, []string{"1.2.3.4/33"}), "invalid denied CIDR 1.2.3.4/33"},
		{nil, net([]string{"0.0.0.0"}, []string{"0.0.0.0/0"}), "invalid allowed CIDR 0.0.0.0"},
		{nil, net([]string{"::/64"}, []string{"0.0.0.0/0"}), "invalid allowed CIDR ::/64"},
		{nil, net([]string{"not a name"}, []string{"0.0.0.0/0"}), "invalid allowed entry not a name"},
		{nil, net([]string{"@nope"}, []string{"0.0.0.0/0"}), "unknown preset"},
		{nil, net([]string{"example.com"}, nil), ErrDomainsNeedDenyAll.Error()},
		{nil, net([]string{"example.com"}, []string{"8.8.8.8"}), ErrDomainsNeedDenyAll.Error()},
		{nil, net([]string{"@pypi"}, nil), ErrDomainsNeedDenyAll.Error()},
		{nil, net([]string{"example.com"}, []string{"0.0.0.0/0:443"}), ErrDomainsNeedDenyAll.Error()},
		// Checked on the lists as given, as E2B does.
		{&f, net([]string{"example.com"}, nil), ErrDomainsNeedDenyAll.Error()},
	}
	for _, tt := range tests {
		_, err := FromE2B(tt.allow, tt.net)
		if err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("FromE2B(%v, %+v) = %v, want an error containing %q", tt.allow, tt.net, err, tt.msg)
		}
	}
}

// FuzzMatch checks that name matching is anchored: whatever the name, an
// allow decision for it implies it equals the exact rule or ends in
// ".<wildcard suffix>".
func FuzzMatch(f *testing.F) {
	for _, s := range []string{"allowed.test", "evilallowed.test", "allowed.test.evil.test", "a.wild.test", "wild.test", "ALLOWED.TEST.", "x.evilwild.test", ".", "..", "a..wild.test"} {
		f.Add(s, s)
	}
	p, err := Compile(Spec{Allow: []Rule{{Name: "allowed.test"}, {Name: "*.wild.test"}}})
	if err != nil {
		f.Fatal(err)
	}
	dst := netip.MustParseAddrPort("203.0.113.10:443")
	f.Fuzz(func(t *testing.T, name, observed string) {
		ok, _ := p.AllowName(name)
		n := strings.ToLower(strings.TrimSuffix(name, "."))
		anchored := n == "allowed.test" || (strings.HasSuffix(n, ".wild.test") && len(n) > len(".wild.test"))
		if ok && !anchored {
			t.Fatalf("AllowName(%q) = true, not anchored", name)
		}
		d := p.Decide(Flow{Proto: TCP, Dst: dst, Names: []string{name}, Observed: observed})
		if d.Allow && !anchored {
			t.Fatalf("Decide(names=[%q], observed=%q) = %+v, not anchored", name, observed, d)
		}
		if d.Allow && observed != "" && observed != "203.0.113.10" {
			o := strings.ToLower(strings.TrimSuffix(observed, "."))
			if o != n {
				t.Fatalf("Decide(names=[%q], observed=%q) = %+v, observed name not among names", name, observed, d)
			}
		}
	})
}

// FuzzNeverReachable checks that no address in a never-reachable range is
// allowed, even under allow-all with 0.0.0.0/0 and ::/0 allowed.
func FuzzNeverReachable(f *testing.F) {
	f.Add([]byte{169, 254, 169, 254})
	f.Add([]byte{0xfd, 0, 0x0e, 0xc2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02, 0x54})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1})
	p, err := Compile(Spec{AllowAll: true, Allow: []Rule{{Prefix: netip.MustParsePrefix("0.0.0.0/0")}, {Prefix: netip.MustParsePrefix("::/0")}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a, ok := netip.AddrFromSlice(b)
		if !ok {
			return
		}
		d := p.Decide(Flow{Proto: TCP, Dst: netip.AddrPortFrom(a, 80), Names: []string{"x.test"}})
		u := a.Unmap()
		bad := u.IsLoopback() || u.IsLinkLocalUnicast() || u.IsMulticast() || u.IsUnspecified() || u.IsPrivate() ||
			u.IsInterfaceLocalMulticast() || u.IsLinkLocalMulticast()
		if bad && d.Allow {
			t.Fatalf("Decide(%v) = %+v, want deny", a, d)
		}
		if d.Allow != p.Reachable(a) {
			t.Fatalf("Decide(%v) = %+v but Reachable = %v", a, d, p.Reachable(a))
		}
	})
}

func BenchmarkDecide(b *testing.B) {
	p := mustCompile(b, Spec{Allow: rules(b, "allowed.test", "*.wild.test", "203.0.113.0/24")})
	f := flow("8.8.8.8:443", "x.y.wild.test")
	b.ReportAllocs()
	for b.Loop() {
		p.Decide(f)
	}
}

func TestParseTargetPorts(t *testing.T) {
	tests := []struct {
		in   string
		want string // Rule.String(), or "error"
	}{
		{"pypi.org:443", "pypi.org port 443"},
		{"*.example.com:80,443", "*.example.com port 80,443"},
		{"10.0.0.0/8:5432-5433", "10.0.0.0/8 port 5432-5433"},
		{"[2001:db8::/32]:443", "2001:db8::/32 port 443"},
		{"2001:db8::/32", "2001:db8::/32"},
		{"[2001:db8::1]", "2001:db8::1/128"},
		{"example.com", "example.com"},
		{"example.com:0", "error"},
		{"example.com:99999", "error"},
		{"example.com:443-80", "error"},
		{"example.com:", "error"},
		{"[2001:db8::1]443", "error"},
	}
	for _, tt := range tests {
		r, err := ParseTarget(tt.in)
		got := "error"
		if err == nil {
			got = r.String()
		}
		if got != tt.want {
			t.Errorf("ParseTarget(%q) = %q (%v), want %q", tt.in, got, err, tt.want)
		}
	}
	// A port-limited rule allows its ports only.
	r, _ := ParseTarget("203.0.113.0/24:443")
	p, err := Compile(Spec{Allow: []Rule{r}})
	if err != nil {
		t.Fatal(err)
	}
	for port, want := range map[uint16]bool{443: true, 80: false} {
		d := p.Decide(Flow{Proto: TCP, Dst: netip.AddrPortFrom(netip.MustParseAddr("203.0.113.10"), port)})
		if d.Allow != want {
			t.Errorf("Decide(203.0.113.10:%d) = %v, want %v", port, d.Allow, want)
		}
	}
}

// TestPlatformEndpoints: the cloud platform endpoints outside link-local
// are never reachable, even through an allow rule that names them.
func TestPlatformEndpoints(t *testing.T) {
	for _, dst := range []string{
		"168.63.129.16:80", "168.63.129.16:32526", "[::ffff:168.63.129.16]:80", "[64:ff9b::a83f:8110]:80",
		"100.100.100.200:80", "192.0.0.192:80", "169.254.0.23:80", "169.254.42.42:80",
		"[fd00:ec2::254]:80", "[fd00:ec2::253]:53", "[fd00:ec2::123]:123", "[fd00:ec2::23]:80",
		"[fd20:ce::254]:80", "[fd00:c1::a9fe:a9fe]:80", "[fd00:42::42]:80",
	} {
		ap := netip.MustParseAddrPort(dst)
		for _, spec := range []Spec{
			{AllowAll: true},
			{Allow: []Rule{{Prefix: netip.PrefixFrom(ap.Addr(), ap.Addr().BitLen())}}},
			{Allow: rules(t, "0.0.0.0/0", "::/0", "168.63.0.0/16", "fd00::/8")},
		} {
			p := mustCompile(t, spec)
			if d := p.Decide(flow(dst)); d.Allow || d.Reason != ReasonNeverReachable {
				t.Errorf("Decide(%s) under %+v = %+v, want never-reachable", dst, spec, d)
			}
			if p.Reachable(ap.Addr()) {
				t.Errorf("Reachable(%s) = true", ap.Addr())
			}
		}
	}
}

// TestOperatorNever: ranges the operator made never reachable stay so
// whatever a sandbox's rules list.
func TestOperatorNever(t *testing.T) {
	never := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/25"), netip.MustParsePrefix("2001:db8:1::/48"), netip.MustParsePrefix("10.9.0.0/16")}
	for _, spec := range []Spec{
		{AllowAll: true, Never: never},
		{Allow: rules(t, "203.0.113.0/24", "2001:db8::/32", "10.9.0.0/16", "allowed.test"), Never: never},
	} {
		p := mustCompile(t, spec)
		for _, f := range []Flow{
			flow("203.0.113.10:443"), flow("203.0.113.10:443", "allowed.test"), flow("[::ffff:203.0.113.10]:443"),
			flow("[2001:db8:1::5]:443"), flow("10.9.1.1:22"),
		} {
			if d := p.Decide(f); d.Allow || d.Reason != ReasonNeverReachable {
				t.Errorf("Decide(%v) = %+v, want never-reachable", f.Dst, d)
			}
		}
		if d := p.Decide(flow("203.0.113.200:443")); !d.Allow {
			t.Errorf("Decide(203.0.113.200) outside the operator's range = %+v, want allowed", d)
		}
	}
	if _, err := Compile(Spec{Never: []netip.Prefix{{}}}); err == nil {
		t.Error("Compile with an invalid never-reachable range succeeded")
	}
}

type liveSet struct{ m map[netip.Addr]bool }

func (s *liveSet) Contains(a netip.Addr) bool { return s.m[a] }

// TestLiveHosts: a host address added after Compile is refused by the
// policy compiled before.
func TestLiveHosts(t *testing.T) {
	hosts := &liveSet{m: map[netip.Addr]bool{}}
	p := mustCompile(t, Spec{Allow: rules(t, "203.0.113.0/24", "10.0.0.0/8"), Hosts: hosts})
	if d := p.Decide(flow("203.0.113.50:80")); !d.Allow {
		t.Fatalf("before the address was added: %+v", d)
	}
	hosts.m[netip.MustParseAddr("203.0.113.50")] = true
	hosts.m[netip.MustParseAddr("10.1.2.3")] = true
	for _, dst := range []string{"203.0.113.50:80", "[::ffff:203.0.113.50]:80", "10.1.2.3:22"} {
		if d := p.Decide(flow(dst)); d.Allow || d.Reason != ReasonNeverReachable {
			t.Errorf("Decide(%s) after the host gained it = %+v, want never-reachable", dst, d)
		}
	}
}

func TestWithNames(t *testing.T) {
	p, err := Compile(Spec{Allow: []Rule{{Name: "a.test"}}, Deny: []Rule{{Name: "*.deny.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	q := p.WithNames([]string{"B.test.", "not a name"})
	for _, tt := range []struct {
		p    *Policy
		name string
		ok   bool
	}{{p, "a.test", true}, {p, "b.test", false}, {q, "a.test", true}, {q, "b.test", true}, {q, "c.b.test", false}} {
		if ok, _ := tt.p.AllowName(tt.name); ok != tt.ok {
			t.Errorf("AllowName(%s) = %v, want %v", tt.name, ok, tt.ok)
		}
	}
}
