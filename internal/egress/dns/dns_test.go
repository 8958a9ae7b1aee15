package dns_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/fencesandbox/fence/internal/egress/dns"
	"github.com/fencesandbox/fence/internal/egress/egresstest"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

func newResolver(t *testing.T, spec policy.Spec, zone map[string][]string, now func() time.Time) (*dns.Resolver, *egresstest.DNSServer) {
	t.Helper()
	srv := egresstest.NewDNSServer(t, zone)
	p, err := policy.Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	r, err := dns.New(dns.Config{Upstream: srv.Addr, Policy: p, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return r, srv
}

func query(t *testing.T, r *dns.Resolver, name string, qtype uint16) (*mdns.Msg, dns.Result) {
	t.Helper()
	q := new(mdns.Msg)
	q.SetQuestion(name, qtype)
	b, _ := q.Pack()
	resp, res := r.Resolve(context.Background(), b)
	var m mdns.Msg
	if err := m.Unpack(resp); err != nil {
		t.Fatalf("Resolve(%s) returned an unparseable answer: %v", name, err)
	}
	if m.Id != q.Id {
		t.Fatalf("Resolve(%s) id = %d, want %d", name, m.Id, q.Id)
	}
	return &m, res
}

func addrs(m *mdns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch v := rr.(type) {
		case *mdns.A:
			out = append(out, v.A.String())
		case *mdns.AAAA:
			out = append(out, v.AAAA.String())
		}
	}
	return out
}

func TestResolve(t *testing.T) {
	zone := map[string][]string{
		"allowed.test":           {"203.0.113.10", "2001:db8::10"},
		"evil.test":              {"203.0.113.66"},
		"evilallowed.test":       {"203.0.113.66"},
		"allowed.test.evil.test": {"203.0.113.66"},
		"meta.allowed2.test":     {"169.254.169.254", "203.0.113.11"},
		"local.allowed2.test":    {"127.0.0.1", "10.0.0.1"},
	}
	spec := policy.Spec{Allow: []policy.Rule{{Name: "allowed.test"}, {Name: "*.allowed2.test"}}}
	now := time.Unix(1e9, 0)
	r, srv := newResolver(t, spec, zone, func() time.Time { return now })

	tests := []struct {
		name  string
		qtype uint16
		rcode int
		want  []string
	}{
		{"allowed.test.", mdns.TypeA, mdns.RcodeSuccess, []string{"203.0.113.10"}},
		{"ALLOWED.Test.", mdns.TypeAAAA, mdns.RcodeSuccess, []string{"2001:db8::10"}},
		{"allowed.test.", mdns.TypeTXT, mdns.RcodeSuccess, nil},
		{"evil.test.", mdns.TypeA, mdns.RcodeNameError, nil},
		{"evilallowed.test.", mdns.TypeA, mdns.RcodeNameError, nil},
		{"allowed.test.evil.test.", mdns.TypeA, mdns.RcodeNameError, nil},
		{"exfil-data.evil.test.", mdns.TypeTXT, mdns.RcodeNameError, nil},
		{"meta.allowed2.test.", mdns.TypeA, mdns.RcodeSuccess, []string{"203.0.113.11"}},
		{"local.allowed2.test.", mdns.TypeA, mdns.RcodeSuccess, nil},
		{"missing.allowed2.test.", mdns.TypeA, mdns.RcodeNameError, nil},
	}
	for _, tt := range tests {
		m, res := query(t, r, tt.name, tt.qtype)
		if m.Rcode != tt.rcode || !slices.Equal(addrs(m), tt.want) {
			t.Errorf("Resolve(%s %s) = %s %v (%+v), want %s %v", tt.name, mdns.TypeToString[tt.qtype],
				mdns.RcodeToString[m.Rcode], addrs(m), res, mdns.RcodeToString[tt.rcode], tt.want)
		}
	}
	// Only allowed A/AAAA names went upstream.
	want := []string{"allowed.test. A", "allowed.test. AAAA", "meta.allowed2.test. A", "local.allowed2.test. A", "missing.allowed2.test. A"}
	if got := srv.Queries(); !slices.Equal(got, want) {
		t.Errorf("upstream queries = %v, want %v", got, want)
	}
	if got := r.NamesFor(netip.MustParseAddr("203.0.113.10")); !slices.Equal(got, []string{"allowed.test"}) {
		t.Errorf("NamesFor(203.0.113.10) = %v, want [allowed.test]", got)
	}
	if got := r.NamesFor(netip.MustParseAddr("169.254.169.254")); got != nil {
		t.Errorf("NamesFor(169.254.169.254) = %v, want none", got)
	}
	// TTL 60 s + 30 s grace.
	now = now.Add(89 * time.Second)
	if got := r.NamesFor(netip.MustParseAddr("2001:db8::10")); len(got) != 1 {
		t.Errorf("NamesFor(2001:db8::10) after 89 s = %v, want [allowed.test]", got)
	}
	now = now.Add(2 * time.Second)
	if got := r.NamesFor(netip.MustParseAddr("2001:db8::10")); got != nil {
		t.Errorf("NamesFor(2001:db8::10) after 91 s = %v, want none", got)
	}
}

func TestRebinding(t *testing.T) {
	r, srv := newResolver(t, policy.Spec{Allow: []policy.Rule{{Name: "rebind.test"}}},
		map[string][]string{"rebind.test": {"203.0.113.10"}}, nil)
	if m, _ := query(t, r, "rebind.test.", mdns.TypeA); !slices.Equal(addrs(m), []string{"203.0.113.10"}) {
		t.Fatalf("first answer = %v, want 203.0.113.10", addrs(m))
	}
	for _, bad := range []string{"169.254.169.254", "127.0.0.1", "10.0.0.1", "0.0.0.0", "100.100.100.200"} {
		srv.Set("rebind.test", bad)
		m, res := query(t, r, "rebind.test.", mdns.TypeA)
		if len(m.Answer) != 0 || res.Reason != dns.ReasonUnreachable {
			t.Errorf("Resolve(rebind.test → %s) = %v (%+v), want no answer", bad, addrs(m), res)
		}
		if got := r.NamesFor(netip.MustParseAddr(bad)); got != nil {
			t.Errorf("NamesFor(%s) = %v, want none", bad, got)
		}
	}
}

func TestMalformed(t *testing.T) {
	r, _ := newResolver(t, policy.Spec{AllowAll: true}, nil, nil)
	if resp, _ := r.Resolve(context.Background(), []byte{1, 2, 3}); resp != nil {
		t.Errorf("Resolve(garbage) = %x, want nil", resp)
	}
	q := new(mdns.Msg)
	q.Question = []mdns.Question{{Name: "a.test.", Qtype: mdns.TypeA, Qclass: mdns.ClassINET}, {Name: "b.test.", Qtype: mdns.TypeA, Qclass: mdns.ClassINET}}
	b, _ := q.Pack()
	resp, _ := r.Resolve(context.Background(), b)
	var m mdns.Msg
	if err := m.Unpack(resp); err != nil || m.Rcode != mdns.RcodeFormatError {
		t.Errorf("Resolve(two questions) = %v, %v, want FORMERR", m.Rcode, err)
	}
}

func FuzzResolve(f *testing.F) {
	q := new(mdns.Msg)
	q.SetQuestion("allowed.test.", mdns.TypeA)
	b, _ := q.Pack()
	f.Add(b)
	p, _ := policy.Compile(policy.Spec{Allow: []policy.Rule{{Name: "allowed.test"}}})
	// The upstream is a closed port: only disallowed names and non-A
	// queries must be answered without it.
	r, err := dns.New(dns.Config{Upstream: "127.0.0.1:9", Policy: p, Timeout: 10 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, res := r.Resolve(context.Background(), b)
		if resp == nil {
			return
		}
		var m mdns.Msg
		if err := m.Unpack(resp); err != nil {
			t.Fatalf("Resolve(%x) answer does not parse: %v", b, err)
		}
		if len(m.Answer) > 0 {
			t.Fatalf("Resolve(%x) = %v with a dead upstream (%+v)", b, m.Answer, res)
		}
	})
}

// A name the policy does not allow waits for Ask: allowed, it resolves;
// refused, it is NXDOMAIN without an upstream query; a name a deny rule
// names is never asked about.
func TestAsk(t *testing.T) {
	zone := map[string][]string{"ask.test": {"203.0.113.20"}, "no.test": {"203.0.113.21"}, "denied.test": {"203.0.113.22"}}
	srv := egresstest.NewDNSServer(t, zone)
	p, err := policy.Compile(policy.Spec{Deny: []policy.Rule{{Name: "denied.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	r, err := dns.New(dns.Config{Upstream: srv.Addr, Policy: p, Ask: func(_ context.Context, name string) bool {
		asked = append(asked, name)
		return name == "ask.test"
	}})
	if err != nil {
		t.Fatal(err)
	}
	if m, res := query(t, r, "ask.test.", mdns.TypeA); m.Rcode != mdns.RcodeSuccess || !slices.Equal(addrs(m), []string{"203.0.113.20"}) || res.Reason != dns.ReasonApproved {
		t.Errorf("approved name: %s %v %+v", mdns.RcodeToString[m.Rcode], addrs(m), res)
	}
	if m, _ := query(t, r, "no.test.", mdns.TypeA); m.Rcode != mdns.RcodeNameError {
		t.Errorf("refused name: %s", mdns.RcodeToString[m.Rcode])
	}
	if m, _ := query(t, r, "denied.test.", mdns.TypeA); m.Rcode != mdns.RcodeNameError {
		t.Errorf("denied name: %s", mdns.RcodeToString[m.Rcode])
	}
	if !slices.Equal(asked, []string{"ask.test", "no.test"}) {
		t.Errorf("asked about %v", asked)
	}
	if got := srv.Queries(); !slices.Equal(got, []string{"ask.test. A"}) {
		t.Errorf("upstream queries = %v", got)
	}
	if got := r.NamesFor(netip.MustParseAddr("203.0.113.20")); !slices.Equal(got, []string{"ask.test"}) {
		t.Errorf("NamesFor = %v", got)
	}
}
