package sandbox

import (
	"context"
	"fmt"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/isolation"
)

// egressPolicy compiles a sandbox's E2B network fields into its policy,
// once, at the boundary: bad rules are a clear 400 and change nothing.
func (m *Manager) egressPolicy(allowInternet *bool, n *api.NetworkConfig) (*policy.Policy, error) {
	if allowInternet == nil && (n == nil || len(n.AllowOut)+len(n.DenyOut) == 0) {
		v := m.allowInternetByDefault
		allowInternet = &v
	}
	spec, err := policy.FromE2B(allowInternet, n)
	if err != nil {
		return nil, invalid("network: %v", err)
	}
	spec.HostAddrs, spec.Hosts, spec.Never = m.hostAddrs, m.hosts, m.never
	p, err := policy.Compile(spec)
	if err != nil {
		return nil, invalid("network: %v", err)
	}
	return p, nil
}

// UpdateNetwork replaces the egress policy of a running sandbox (E2B's
// PUT /sandboxes/{id}/network). Flows already open keep going; new ones
// follow the new policy.
func (m *Manager) UpdateNetwork(ctx context.Context, id string, allowInternet *bool, n *api.NetworkConfig) error {
	p, err := m.egressPolicy(allowInternet, n)
	if err != nil {
		return err
	}
	m.mu.Lock()
	e, ok := m.running[id]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("sandbox %s: %w", id, api.ErrNotFound)
	}
	setter, ok := e.box.(isolation.EgressSetter)
	if !ok {
		return fmt.Errorf("sandbox %s cannot change its network: %w", id, api.ErrFailedPrecondition)
	}
	setter.SetEgress(p)
	if v, ok := m.gateways.Load(id); ok {
		gs := v.(*gatewayState)
		var bindings []gateway.Binding
		if old := gs.cfg.Load(); old != nil {
			bindings = old.Bindings
		}
		gs.cfg.Store(m.buildGateway(ctx, p, n, bindings))
	}
	m.mu.Lock()
	e.info.AllowInternetAccess = allowInternet
	if n != nil {
		var net api.NetworkConfig
		if e.info.Network != nil {
			net = *e.info.Network
		}
		net.AllowOut, net.DenyOut = n.AllowOut, n.DenyOut
		e.info.Network = &net
	}
	m.mu.Unlock()
	m.log.InfoContext(ctx, "sandbox network updated", "sandbox_id", id)
	return nil
}
