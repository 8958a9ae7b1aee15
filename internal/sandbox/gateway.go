package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/gateway"
)

// maxBindings bounds the secret bindings of one sandbox.
const maxBindings = 32

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

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

// buildGateway compiles a sandbox's network fields and secret bindings
// into the gateway's configuration. Bindings keep the placeholders of
// prev (a network update does not change what the sandbox holds).
func (m *Manager) buildGateway(ctx context.Context, pol *policy.Policy, n *api.NetworkConfig, bindings []gateway.Binding) *gateway.Config {
	cfg := &gateway.Config{Policy: pol, Bindings: bindings, Inspect: m.inspectByDefault}
	if n != nil {
		if n.Inspect != nil {
			cfg.Inspect = *n.Inspect
		}
		for _, p := range n.Passthrough {
			cfg.Passthrough = append(cfg.Passthrough, strings.ToLower(strings.TrimSpace(p)))
		}
		if len(n.Rules) > 0 {
			cfg.Rules = map[string]map[string]string{}
			for host, rules := range n.Rules {
				hdrs := map[string]string{}
				for _, r := range rules {
					if r.Transform != nil {
						maps.Copy(hdrs, r.Transform.Headers)
					}
				}
				cfg.Rules[strings.ToLower(strings.TrimSpace(host))] = hdrs
			}
		}
	}
	return cfg
}

// bindSecrets checks a create's secret bindings and makes their
// placeholders: the variables the sandbox gets (placeholder values only)
// and the bindings the gateway swaps them by. A binding to a secret that
// does not exist is a 400.
func (m *Manager) bindSecrets(ctx context.Context, req CreateRequest) (map[string]string, []gateway.Binding, error) {
	if len(req.Secrets) == 0 {
		return nil, nil, nil
	}
	if len(req.Secrets) > maxBindings {
		return nil, nil, invalid("secrets: at most %d bindings", maxBindings)
	}
	env := map[string]string{}
	var out []gateway.Binding
	for _, name := range slices.Sorted(maps.Keys(req.Secrets)) {
		b := req.Secrets[name]
		if !envName.MatchString(name) {
			return nil, nil, invalid("secrets: %q is not a valid environment variable name", name)
		}
		if _, dup := req.EnvVars[name]; dup {
			return nil, nil, invalid("secrets: %q is also set in envVars", name)
		}
		secret := strings.ToLower(strings.TrimSpace(b.Secret))
		if secret == "" {
			return nil, nil, invalid("secrets: %s names no secret", name)
		}
		if len(b.Hosts) == 0 {
			return nil, nil, invalid("secrets: %s is bound to no host", name)
		}
		var hosts []string
		for _, h := range b.Hosts {
			h = strings.ToLower(strings.TrimSpace(h))
			r, err := policy.ParseTarget(h)
			if err != nil || r.Name == "" || len(r.Ports) > 0 {
				return nil, nil, invalid("secrets: %s: host %q is not a name or *.name", name, h)
			}
			hosts = append(hosts, h)
		}
		var places gateway.Place
		for _, p := range b.Places {
			switch p {
			case "header":
				places |= gateway.PlaceHeader
			case "query":
				places |= gateway.PlaceQuery
			case "basicAuth":
				places |= gateway.PlaceBasicAuth
			default:
				return nil, nil, invalid("secrets: %s: unknown place %q (header, query, basicAuth)", name, p)
			}
		}
		if places == 0 {
			places = gateway.PlaceHeader
		}
		if m.secrets != nil {
			if _, err := m.secrets.Value(ctx, secret); err != nil {
				if errors.Is(err, api.ErrNotFound) {
					return nil, nil, invalid("secrets: %s: secret %q not found", name, secret)
				}
				return nil, nil, fmt.Errorf("looking up secret for %s: %w", name, err)
			}
		}
		ph := newPlaceholder()
		env[name] = ph
		out = append(out, gateway.Binding{Env: name, Secret: secret, Placeholder: ph, Hosts: hosts, Places: places})
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
