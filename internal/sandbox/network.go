package sandbox

import (
	"context"
	"fmt"
	"net"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/netfence"
)

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

// applyNetwork gives a sandbox's fence the compiled network: the egress
// proxy first (behind a deny-all while it changes, so no new flow takes
// the old route under the new policy or the reverse), then the policy.
func applyNetwork(nw *netfence.Net, nc *netconf.Config, proxyChanged bool) {
	if proxyChanged {
		nw.SetPolicy(nil) // deny all meanwhile
		nw.SetProxy(nc.Proxy)
	}
	nw.SetPolicy(nc.Policy)
}

// PoolNetwork is the fence of sandboxes started ahead of their create (a
// warm pool's, warm.Target.Network): deny-all until the create that takes
// one gives it its network.
func (m *Manager) PoolNetwork() isolation.Network { return m.fences.network(nil, nil) }

// SandboxNet returns the fence of live sandbox id (nil if it has none):
// the policy and egress proxy in force, and the stack its ports are
// reached through.
func (m *Manager) SandboxNet(id string) *netfence.Net {
	return m.fences.get(id)
}

// DialPort connects to TCP port inside running sandbox id, through its
// fence (ingress: the daemon's proxy, a template's ready ports). A paused
// sandbox gives an error wrapping isolation.ErrPaused, an unknown or
// killed one isolation.ErrNotFound.
func (m *Manager) DialPort(ctx context.Context, id string, port uint16) (net.Conn, error) {
	e, err := m.lookup(id)
	if err != nil {
		return nil, fmt.Errorf("dialing sandbox %s: %w", id, isolation.ErrNotFound)
	}
	if e.state() != StateRunning {
		return nil, fmt.Errorf("dialing sandbox %s: %w", id, isolation.ErrPaused)
	}
	return m.fences.dial(ctx, id, port)
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
	nw := m.fences.get(id)
	if nw == nil {
		return fmt.Errorf("sandbox %s has no network: %w", id, api.ErrConflict)
	}
	applyNetwork(nw, nc, proxyChanged)
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
