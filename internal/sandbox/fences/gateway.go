package fences

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
	cfg  atomic.Pointer[gateway.Config]
	once onceGrants // names approved once (approval.go)
}

// GatewayConfig returns the egress gateway's view of sandbox id, or nil
// for a sandbox the core has not (or no longer) handed out: a pooled
// sandbox runs nothing of a user's, and the gateway intercepts nothing of
// it.
func (s *Set) GatewayConfig(id string) *gateway.Config {
	v, ok := s.gateways.Load(id)
	if !ok {
		return nil
	}
	gs := v.(*gatewayState)
	return gs.once.apply(gs.cfg.Load())
}

// Bindings returns the secret bindings of sandbox id's gateway
// configuration (nil without one).
func (s *Set) Bindings(id string) []gateway.Binding {
	if g := s.GatewayConfig(id); g != nil {
		return g.Bindings
	}
	return nil
}

// SetGateway gives sandbox id the gateway configuration of its compiled
// network nc and its secret bindings: from here the gateway intercepts
// its flows, until Drop.
func (s *Set) SetGateway(id string, nc *netconf.Config, bindings []gateway.Binding) {
	gw := &gatewayState{}
	gw.cfg.Store(s.gatewayConfig(nc, bindings))
	s.gateways.Store(id, gw)
}

// gatewayConfig is the gateway's view of a compiled network and the
// sandbox's bindings.
func (s *Set) gatewayConfig(nc *netconf.Config, bindings []gateway.Binding) *gateway.Config {
	cfg := &gateway.Config{Policy: nc.Policy, Rules: nc.Rules, Bindings: bindings,
		Inspect: s.inspect, Passthrough: nc.Passthrough}
	if nc.Inspect != nil {
		cfg.Inspect = *nc.Inspect
	}
	return cfg
}

// BindSecrets makes the placeholders of a create's validated secret
// bindings: the variables the sandbox gets (placeholder values only) and
// the bindings the gateway swaps them by. A binding to a secret that does
// not exist is an error wrapping api.ErrInvalidArgument.
func (s *Set) BindSecrets(ctx context.Context, in []netconf.Binding) (map[string]string, []gateway.Binding, error) {
	if len(in) == 0 {
		return nil, nil, nil
	}
	env := map[string]string{}
	var out []gateway.Binding
	for _, b := range in {
		if s.secrets != nil {
			if _, err := s.secrets.Value(ctx, b.Secret); err != nil {
				if errors.Is(err, api.ErrNotFound) {
					return nil, nil, fmt.Errorf("secrets: %s: secret %q not found: %w", b.Env, b.Secret, api.ErrInvalidArgument)
				}
				return nil, nil, fmt.Errorf("looking up secret for %s: %w", b.Env, err)
			}
			// The binding names the secret of the create's team by its ID.
			if ids, ok := s.secrets.(secretIDs); ok {
				id, err := ids.SecretID(ctx, b.Secret)
				if err != nil {
					return nil, nil, fmt.Errorf("looking up secret for %s: %w", b.Env, err)
				}
				b.Secret = id
			}
		}
		ph := newPlaceholder()
		env[b.Env] = ph
		out = append(out, gateway.Binding{Env: b.Env, Secret: b.Secret, Placeholder: ph,
			Hosts: slices.Clone(b.Hosts), Places: b.Places})
	}
	return env, out, nil
}

// secretIDs is implemented by secret stores whose secrets a name can
// stand for in more than one team (*secrets.Store).
type secretIDs interface {
	SecretID(ctx context.Context, sel string) (string, error)
}

// newPlaceholder returns a value that stands for a secret inside one
// sandbox: random, so that it names one sandbox's binding and cannot be
// guessed by another.
func newPlaceholder() string {
	var b [20]byte
	rand.Read(b[:])
	return "fence_secret_" + hex.EncodeToString(b[:])
}
