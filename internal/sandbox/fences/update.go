package fences

import (
	"context"
	"fmt"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/netfence"
)

// ShowFunc returns what a sandbox shows of its network (its
// allow_internet_access and network), given what it shows now.
type ShowFunc func(allowInternet *bool, network *api.NetworkConfig) (*bool, *api.NetworkConfig)

// Compile validates a create's or update's network fields and compiles
// them, once, at the boundary: bad input is an error wrapping
// api.ErrInvalidArgument and changes nothing.
func (s *Set) Compile(ctx context.Context, r netconf.Request) (*netconf.Config, error) {
	return netconf.Compile(ctx, s.defaults, r)
}

// Apply gives a sandbox's fence the compiled network: the egress proxy
// first (behind a deny-all while it changes, so no new flow takes the old
// route under the new policy or the reverse), then the policy.
func (s *Set) Apply(nw *netfence.Net, nc *netconf.Config, proxyChanged bool) {
	if proxyChanged {
		nw.SetPolicy(nil) // deny all meanwhile
		nw.SetProxy(nc.Proxy)
	}
	nw.SetPolicy(nc.Policy)
}

// UpdateNetwork replaces the egress configuration of a running sandbox
// (E2B's PUT /sandboxes/{id}/network): allowOut, denyOut, rules and the
// egress proxy are replaced as a whole, an omitted field is cleared, and
// the ingress fields are kept. allowInternet, when set, is re-applied and
// stored; when nil the stored flag stays, but the new policy has no
// deny-all unless denyOut holds 0.0.0.0/0 (so {} re-opens traffic).
// Flows already open keep going; new ones follow the new configuration.
func (s *Set) UpdateNetwork(ctx context.Context, id string, allowInternet *bool, n *api.NetworkConfig) error {
	s.updateMu.Lock() // one update at a time: each reads the proxy the last one set
	defer s.updateMu.Unlock()
	sb, err := s.core.Sandbox(id)
	if err != nil {
		return err
	}
	if n != nil {
		// Ingress fields cannot change.
		c := *n
		c.AllowPublicTraffic, c.MaskRequestHost = nil, ""
		n = &c
	}
	nc, err := s.Compile(ctx, netconf.Request{AllowInternetAccess: allowInternet, Network: n, Update: true})
	if err != nil {
		return err
	}
	proxyChanged := sb.Network().Proxy != nil || nc.Proxy != nil
	nw := s.Net(id)
	if nw == nil {
		return fmt.Errorf("sandbox %s has no network: %w", id, api.ErrConflict)
	}
	s.Apply(nw, nc, proxyChanged)
	if v, ok := s.gateways.Load(id); ok {
		// The gateway follows on the sandbox's next request; the
		// placeholders the sandbox holds stay bound.
		gs := v.(*gatewayState)
		var bindings []gateway.Binding
		if old := gs.cfg.Load(); old != nil {
			bindings = old.Bindings
		}
		gs.cfg.Store(s.gatewayConfig(nc, bindings))
	}
	sb.SetNetwork(nc, func(allow *bool, old *api.NetworkConfig) (*bool, *api.NetworkConfig) {
		if allowInternet != nil {
			v := *allowInternet
			allow = &v
		}
		var shown api.NetworkConfig
		if nc.Shown != nil {
			shown = *nc.Shown
		}
		if old != nil {
			shown.AllowPublicTraffic, shown.MaskRequestHost = old.AllowPublicTraffic, old.MaskRequestHost
		}
		if shownEmpty(&shown) {
			return allow, nil
		}
		return allow, &shown
	})
	s.log.InfoContext(ctx, "sandbox network updated", "sandbox_id", id)
	return nil
}

func shownEmpty(n *api.NetworkConfig) bool {
	return len(n.AllowOut)+len(n.DenyOut)+len(n.Rules)+len(n.Passthrough) == 0 &&
		n.EgressProxy == nil && n.AllowPublicTraffic == nil && n.MaskRequestHost == "" && n.Inspect == nil &&
		n.Approval == ""
}
