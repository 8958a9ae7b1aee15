package fake

import (
	"sync"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

// egressState is what a fake sandbox was told about its network.
type egressState struct {
	mu     sync.Mutex
	policy *policy.Policy
	set    bool
	proxy  *egress.Proxy
}

// SetEgress implements isolation.EgressSetter: it records p (nil: deny
// all).
func (s *Sandbox) SetEgress(p *policy.Policy) {
	s.net.mu.Lock()
	defer s.net.mu.Unlock()
	s.net.policy, s.net.set = p, true
}

// SetEgressProxy records the sandbox's egress proxy.
func (s *Sandbox) SetEgressProxy(p *egress.Proxy) {
	s.net.mu.Lock()
	defer s.net.mu.Unlock()
	s.net.proxy = p
}

// Egress returns the policy in force: the last SetEgress, or the spec's.
func (s *Sandbox) Egress() *policy.Policy {
	s.net.mu.Lock()
	defer s.net.mu.Unlock()
	if s.net.set {
		return s.net.policy
	}
	return s.spec.Egress
}

// EgressProxy returns the last SetEgressProxy.
func (s *Sandbox) EgressProxy() *egress.Proxy {
	s.net.mu.Lock()
	defer s.net.mu.Unlock()
	return s.net.proxy
}
