package sandbox

import (
	"context"
	"fmt"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
)

// ProxySetter is implemented by sandboxes whose egress can be tunnelled
// through a SOCKS5 proxy (E2B's egressProxy); nil connects directly.
type ProxySetter interface {
	SetEgressProxy(p *egress.Proxy)
}

// compileNetwork validates a create's or update's network fields and
// compiles them, once, at the boundary: bad input is a clear 400 and
// changes nothing.
func (m *Manager) compileNetwork(ctx context.Context, r netconf.Request) (*netconf.Config, error) {
	return netconf.Compile(ctx, netconf.Defaults{
		AllowInternet: m.allowInternetByDefault,
		HostAddrs:     m.hostAddrs,
		Hosts:         m.hosts,
		Never:         m.never,
	}, r)
}

// createEgress is the policy a new sandbox starts with: its own, or deny
// all while an egress proxy is still to be set (applyNetwork opens it
// once the proxy is in place, so no flow ever leaves directly).
func createEgress(nc *netconf.Config) *policy.Policy {
	if nc.Proxy != nil {
		return nil
	}
	return nc.Policy
}

// applyNetwork gives a running sandbox the compiled network: the egress
// proxy first (behind a deny-all while it changes, so no new flow takes
// the old route under the new policy or the reverse), then the policy.
func applyNetwork(box isolation.Sandbox, nc *netconf.Config, proxyChanged bool) error {
	setter, ok := box.(isolation.EgressSetter)
	if !ok {
		return fmt.Errorf("sandbox %s cannot change its network: %w", box.ID(), api.ErrConflict)
	}
	if proxyChanged {
		ps, ok := box.(ProxySetter)
		if !ok {
			if nc.Proxy != nil {
				return fmt.Errorf("sandbox %s cannot use an egress proxy: %w", box.ID(), api.ErrFailedPrecondition)
			}
		} else {
			setter.SetEgress(nil) // deny all meanwhile
			ps.SetEgressProxy(nc.Proxy)
		}
	}
	setter.SetEgress(nc.Policy)
	return nil
}

// UpdateNetwork replaces the egress configuration of a running sandbox
// (E2B's PUT /sandboxes/{id}/network): allowOut, denyOut, rules and the
// egress proxy are replaced as a whole, an omitted field is cleared, and
// the ingress fields are kept. allowInternet, when set, is re-applied and
// stored; when nil the stored flag stays, but the new policy has no
// deny-all unless denyOut holds 0.0.0.0/0 (so {} re-opens traffic).
// Flows already open keep going; new ones follow the new configuration.
func (m *Manager) UpdateNetwork(ctx context.Context, id string, allowInternet *bool, n *api.NetworkConfig) error {
	m.netMu.Lock() // one update at a time: each reads the proxy the last one set
	defer m.netMu.Unlock()
	e, err := m.lookup(id)
	if err != nil {
		return err
	}
	if n != nil {
		// Ingress fields cannot change.
		c := *n
		c.AllowPublicTraffic, c.MaskRequestHost = nil, ""
		n = &c
	}
	nc, err := m.compileNetwork(ctx, netconf.Request{AllowInternetAccess: allowInternet, Network: n, Update: true})
	if err != nil {
		return err
	}
	e.mu.Lock()
	proxyChanged := e.net.Proxy != nil || nc.Proxy != nil
	e.mu.Unlock()
	if err := applyNetwork(e.sb(), nc, proxyChanged); err != nil {
		return err
	}
	if v, ok := m.gateways.Load(id); ok {
		// The gateway follows on the sandbox's next request; the
		// placeholders the sandbox holds stay bound.
		gs := v.(*gatewayState)
		var bindings []gateway.Binding
		if old := gs.cfg.Load(); old != nil {
			bindings = old.Bindings
		}
		gs.cfg.Store(m.gatewayConfig(nc, bindings))
	}
	e.mu.Lock()
	if allowInternet != nil {
		v := *allowInternet
		e.info.AllowInternetAccess = &v
	}
	var shown api.NetworkConfig
	if nc.Shown != nil {
		shown = *nc.Shown
	}
	if old := e.info.Network; old != nil {
		shown.AllowPublicTraffic, shown.MaskRequestHost = old.AllowPublicTraffic, old.MaskRequestHost
	}
	if shownEmpty(&shown) {
		e.info.Network = nil
	} else {
		e.info.Network = &shown
	}
	e.net = nc
	e.mu.Unlock()
	m.log.InfoContext(ctx, "sandbox network updated", "sandbox_id", id)
	return nil
}

func shownEmpty(n *api.NetworkConfig) bool {
	return len(n.AllowOut)+len(n.DenyOut)+len(n.Rules)+len(n.Passthrough) == 0 &&
		n.EgressProxy == nil && n.AllowPublicTraffic == nil && n.MaskRequestHost == "" && n.Inspect == nil
}
