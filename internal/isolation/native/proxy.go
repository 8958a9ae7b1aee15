package native

import "github.com/fencesandbox/fence/internal/egress"

// SetEgressProxy implements sandbox.ProxySetter: the sandbox's allowed TCP
// flows go through p (nil: directly) from their next connection on.
func (s *sandbox) SetEgressProxy(p *egress.Proxy) {
	if s.net != nil {
		s.net.SetProxy(p)
	}
}
