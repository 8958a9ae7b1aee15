package egress_test

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

// A lookup of a name the policy does not allow waits for Options.Ask:
// approved once, the lookup answers and the connection to the address it
// gave is admitted (the name verified against the Host); refused, the
// lookup fails and no connection is admitted; a policy decision is in
// force from the stack's SetPolicy, made before Ask returns.
func TestAsk(t *testing.T) {
	answers := map[string]egress.Approval{"allowed.test": egress.AllowOnce, "evil.test": egress.Refused}
	var mu sync.Mutex
	var asked []string
	var e *env
	e = newEnv(t, policy.Spec{}, func(o *egress.Options) {
		o.Ask = func(_ context.Context, name string) egress.Approval {
			mu.Lock()
			asked = append(asked, name)
			mu.Unlock()
			if name == "shared.test" {
				p, err := policy.Compile(policy.Spec{Allow: []policy.Rule{{Name: "shared.test"}}})
				if err != nil {
					t.Error(err)
				}
				e.st.SetPolicy(p)
				return egress.AllowPolicy
			}
			return answers[name]
		}
	})
	if as := e.lookup(t, "evil.test"); as != nil {
		t.Fatalf("refused name resolved to %v", as)
	}
	if _, err := e.get(t, ap("203.0.113.66:80"), "evil.test"); err == nil {
		t.Fatal("connection to a refused name's address was admitted")
	}
	as := e.lookup(t, "allowed.test")
	if len(as) == 0 {
		t.Fatal("approved name did not resolve")
	}
	for _, a := range as {
		if got, err := e.get(t, netip.AddrPortFrom(a, 80), "allowed.test"); err != nil || got != "hello allowed.test" {
			t.Fatalf("GET via approved name = %q, %v", got, err)
		}
	}
	if got := e.st.Granted(); !slices.Equal(got, []string{"allowed.test"}) {
		t.Fatalf("granted %v", got)
	}
	// Approved once for allowed.test does not open another name behind
	// the same address.
	if _, err := e.get(t, netip.AddrPortFrom(as[0], 80), "evil.test"); err == nil {
		t.Fatal("a Host other than the approved name was admitted")
	}
	if as := e.lookup(t, "shared.test"); len(as) == 0 {
		t.Fatal("name approved into the policy did not resolve")
	}
	if got, err := e.get(t, ap("203.0.113.20:80"), "shared.test"); err != nil || got != "hello shared.test" {
		t.Fatalf("GET via name approved into the policy = %q, %v", got, err)
	}
	// A policy set later keeps the names granted once.
	empty, err := policy.Compile(policy.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	e.st.SetPolicy(empty)
	if ok, _ := e.st.Policy().AllowName("allowed.test"); !ok {
		t.Fatal("a grant was lost by SetPolicy")
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(asked)
	asked = slices.Compact(asked)
	if !slices.Equal(asked, []string{"allowed.test", "evil.test", "shared.test"}) {
		t.Fatalf("asked %v", asked)
	}
}
