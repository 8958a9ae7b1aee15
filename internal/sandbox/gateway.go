package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/netconf"
)

// gatewayState is what the egress gateway reads for one sandbox, swapped
// whole on a network update.
type gatewayState struct {
	cfg atomic.Pointer[gateway.Config]
}

// GatewayConfig returns the egress gateway's view of sandbox id, or nil
// for a sandbox the manager has not (or no longer) handed out: a pooled
// sandbox runs nothing of a user's, and the gateway intercepts nothing of
// it.
func (m *Manager) GatewayConfig(id string) *gateway.Config {
	v, ok := m.gateways.Load(id)
	if !ok {
		return nil
	}
	return v.(*gatewayState).cfg.Load()
}

// gatewayConfig is the gateway's view of a compiled network and the
// sandbox's bindings.
func (m *Manager) gatewayConfig(nc *netconf.Config, bindings []gateway.Binding) *gateway.Config {
	cfg := &gateway.Config{Policy: nc.Policy, Rules: nc.Rules, Bindings: bindings,
		Inspect: m.inspectByDefault, Passthrough: nc.Passthrough}
	if nc.Inspect != nil {
		cfg.Inspect = *nc.Inspect
	}
	return cfg
}

// bindSecrets makes the placeholders of a create's validated secret
// bindings: the variables the sandbox gets (placeholder values only) and
// the bindings the gateway swaps them by. A binding to a secret that does
// not exist is a 400.
func (m *Manager) bindSecrets(ctx context.Context, in []netconf.Binding) (map[string]string, []gateway.Binding, error) {
	if len(in) == 0 {
		return nil, nil, nil
	}
	env := map[string]string{}
	var out []gateway.Binding
	for _, b := range in {
		if m.secrets != nil {
			if _, err := m.secrets.Value(ctx, b.Secret); err != nil {
				if errors.Is(err, api.ErrNotFound) {
					return nil, nil, invalid("secrets: %s: secret %q not found", b.Env, b.Secret)
				}
				return nil, nil, fmt.Errorf("looking up secret for %s: %w", b.Env, err)
			}
		}
		ph := newPlaceholder()
		env[b.Env] = ph
		out = append(out, gateway.Binding{Env: b.Env, Secret: b.Secret, Placeholder: ph,
			Hosts: slices.Clone(b.Hosts), Places: b.Places})
	}
	return env, out, nil
}

// newPlaceholder returns a value that stands for a secret inside one
// sandbox: random, so that it names one sandbox's binding and cannot be
// guessed by another.
func newPlaceholder() string {
	var b [20]byte
	rand.Read(b[:])
	return "fence_secret_" + hex.EncodeToString(b[:])
}
