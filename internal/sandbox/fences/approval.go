package fences

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/approvals"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/netconf"
)

// Approvals is the queue a sandbox with network approval "ask" asks;
// *approvals.Queue implements it.
type Approvals interface {
	Ask(ctx context.Context, sandboxID, teamID, name string) (approvals.Decision, error)
}

var _ Approvals = (*approvals.Queue)(nil)

// ask answers a sandbox's stack about name (egress.Options.Ask): a sandbox
// that is not handed out, or whose network does not ask, is refused at
// once; one that asks waits for the queue's decision. A "sandbox" or
// "team" decision was put in the policy (AllowName) before the queue
// returns it.
func (s *Set) ask(ctx context.Context, id, name string) egress.Approval {
	if s.approvals == nil || s.core == nil {
		return egress.Refused
	}
	sb, err := s.core.Sandbox(id)
	if err != nil {
		return egress.Refused
	}
	if nc := sb.Network(); nc == nil || !nc.Ask {
		return egress.Refused
	}
	team, _ := s.core.Team(id)
	if s.teamAllowed(ctx, team, name) {
		// Approved for the whole team: the sandbox's policy gains it.
		if err := s.AllowName(ctx, id, name); err != nil {
			s.log.WarnContext(ctx, "allowing a name approved for the team", "sandbox_id", id, "name", name, "err", err)
			return egress.Refused
		}
		return egress.AllowPolicy
	}
	d, err := s.approvals.Ask(ctx, id, team, name)
	switch {
	case err != nil:
		s.log.DebugContext(ctx, "approval request refused", "sandbox_id", id, "name", name, "error", err)
		return egress.Refused
	case d == approvals.Once:
		if v, ok := s.gateways.Load(id); ok {
			v.(*gatewayState).once.grant(name, time.Now().Add(egress.OnceGrant))
		}
		return egress.AllowOnce
	case d.Allows():
		return egress.AllowPolicy
	}
	return egress.Refused
}

// AllowName adds name to the egress allowlist of sandbox id from now on
// (the "sandbox" decision on an approval request), the way a network
// update does: its policy, its gateway's view and what the API shows of
// its network (allowOut) all gain the name. Flows already open keep going.
func (s *Set) AllowName(ctx context.Context, id, name string) error {
	s.updateMu.Lock()
	defer s.updateMu.Unlock()
	sb, err := s.core.Sandbox(id)
	if err != nil {
		return err
	}
	old := sb.Network()
	if old == nil || old.Policy == nil {
		return fmt.Errorf("sandbox %s has no network policy: %w", id, api.ErrConflict)
	}
	nw := s.Net(id)
	if nw == nil {
		return fmt.Errorf("sandbox %s has no network: %w", id, api.ErrConflict)
	}
	nc := *old
	nc.Policy = old.Policy.WithNames([]string{name})
	if old.Shown != nil {
		shown := *old.Shown
		if !slices.Contains(shown.AllowOut, name) {
			shown.AllowOut = append(slices.Clip(shown.AllowOut), name)
		}
		nc.Shown = &shown
	}
	s.Apply(nw, &nc, false)
	if v, ok := s.gateways.Load(id); ok {
		gs := v.(*gatewayState)
		if cfg := gs.cfg.Load(); cfg != nil {
			gs.cfg.Store(s.gatewayConfig(&nc, cfg.Bindings))
		}
	}
	sb.SetNetwork(&nc, func(allow *bool, n *api.NetworkConfig) (*bool, *api.NetworkConfig) {
		if n == nil {
			return allow, &api.NetworkConfig{AllowOut: []string{name}, Approval: netconf.ApprovalAsk}
		}
		c := *n
		if !slices.Contains(c.AllowOut, name) {
			c.AllowOut = append(slices.Clip(c.AllowOut), name)
		}
		return allow, &c
	})
	s.log.InfoContext(ctx, "sandbox network allows an approved name", "sandbox_id", id, "name", name)
	return nil
}

// onceGrants are the names of one sandbox approved once, with their
// expiry: its stack allows them for egress.OnceGrant, and so does the
// gateway's view of its policy, for the flows the gateway intercepts.
type onceGrants struct {
	mu sync.Mutex
	// +checklocks:mu
	names map[string]time.Time
}

// grant allows name until t; at most 16 names are kept, the oldest
// expiry goes first.
func (g *onceGrants) grant(name string, t time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	maps.DeleteFunc(g.names, func(_ string, e time.Time) bool { return !now.Before(e) })
	if g.names == nil {
		g.names = map[string]time.Time{}
	}
	if _, ok := g.names[name]; !ok && len(g.names) >= 16 {
		oldest := ""
		for n, e := range g.names {
			if oldest == "" || e.Before(g.names[oldest]) {
				oldest = n
			}
		}
		delete(g.names, oldest)
	}
	g.names[name] = t
}

// apply returns cfg with the names granted and not expired allowed (cfg
// itself when there are none).
func (g *onceGrants) apply(cfg *gateway.Config) *gateway.Config {
	g.mu.Lock()
	defer g.mu.Unlock()
	if cfg == nil || cfg.Policy == nil || len(g.names) == 0 {
		return cfg
	}
	now := time.Now()
	maps.DeleteFunc(g.names, func(_ string, e time.Time) bool { return !now.Before(e) })
	if len(g.names) == 0 {
		return cfg
	}
	c := *cfg
	c.Policy = cfg.Policy.WithNames(slices.Sorted(maps.Keys(g.names)))
	return &c
}
