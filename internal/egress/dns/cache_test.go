package dns_test

import (
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/fencesandbox/fence/internal/egress/dns"
	"github.com/fencesandbox/fence/internal/egress/egresstest"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

// TestSharedCache checks that resolvers sharing a Cache ask the upstream
// once per TTL between them, hand out the remaining TTL, still apply
// their own policy, and still record what they handed out.
func TestSharedCache(t *testing.T) {
	srv := egresstest.NewDNSServer(t, map[string][]string{
		"allowed.test": {"203.0.113.10"}, "zero.test": {"203.0.113.11"}, "meta.test": {"169.254.169.254"},
	})
	srv.SetTTL("zero.test", 0)
	now := time.Unix(1e9, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	cache := dns.NewCache(16)
	newR := func(spec policy.Spec) *dns.Resolver {
		p, err := policy.Compile(spec)
		if err != nil {
			t.Fatal(err)
		}
		r, err := dns.New(dns.Config{Upstream: srv.Addr, Policy: p, Now: clock, Cache: cache})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	allow := policy.Spec{Allow: []policy.Rule{{Name: "allowed.test"}, {Name: "zero.test"}, {Name: "meta.test"}}}
	a, b, none := newR(allow), newR(allow), newR(policy.Spec{})

	m, _ := query(t, a, "allowed.test.", mdns.TypeA)
	advance(10 * time.Second)
	m2, _ := query(t, b, "ALLOWED.test.", mdns.TypeA)
	if !slices.Equal(addrs(m2), addrs(m)) || len(m2.Answer) != 1 || m2.Answer[0].Header().Ttl != 50 {
		t.Errorf("cached answer = %v, want %v with TTL 50", m2.Answer, addrs(m))
	}
	if got := b.NamesFor(netip.MustParseAddr("203.0.113.10")); !slices.Equal(got, []string{"allowed.test"}) {
		t.Errorf("NamesFor after a cached answer = %v, want [allowed.test]", got)
	}
	if m3, _ := query(t, none, "allowed.test.", mdns.TypeA); m3.Rcode != mdns.RcodeNameError {
		t.Errorf("a resolver whose policy denies the name got %v from the cache", m3.Answer)
	}
	// Never-reachable answers are dropped by each resolver, cached or not.
	query(t, a, "meta.test.", mdns.TypeA)
	if m4, res := query(t, b, "meta.test.", mdns.TypeA); len(m4.Answer) != 0 || res.Reason != dns.ReasonUnreachable {
		t.Errorf("cached never-reachable answer = %v (%+v), want none", m4.Answer, res)
	}
	// TTL 0 is not kept.
	query(t, a, "zero.test.", mdns.TypeA)
	query(t, b, "zero.test.", mdns.TypeA)
	advance(51 * time.Second)
	query(t, a, "allowed.test.", mdns.TypeA)
	want := []string{"allowed.test. A", "meta.test. A", "zero.test. A", "zero.test. A", "allowed.test. A"}
	if got := srv.Queries(); !slices.Equal(got, want) {
		t.Errorf("upstream queries = %v, want %v", got, want)
	}
	if cache.Len() > 2 {
		t.Errorf("cache holds %d entries, want at most 2", cache.Len())
	}
}

// TestCacheBound fills a small cache with more names than it holds.
func TestCacheBound(t *testing.T) {
	zone := map[string][]string{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
		zone[n+".wild.test"] = []string{"203.0.113.10"}
	}
	srv := egresstest.NewDNSServer(t, zone)
	p, _ := policy.Compile(policy.Spec{Allow: []policy.Rule{{Name: "*.wild.test"}}})
	cache := dns.NewCache(3)
	r, err := dns.New(dns.Config{Upstream: srv.Addr, Policy: p, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	for n := range zone {
		query(t, r, n+".", mdns.TypeA)
	}
	if cache.Len() != 3 {
		t.Errorf("cache holds %d entries, want 3", cache.Len())
	}
}
