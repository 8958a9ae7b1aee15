package fences

import (
	"context"
	"time"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Budget is the teams' daily egress allowance; *tenancy.Quotas
// implements it.
type Budget interface {
	// EgressSpent reports whether team has spent its egress of now's day.
	EgressSpent(team string, now time.Time) bool
	// ChargeEgress counts a flow's bytes against team's day and reports
	// whether the day is spent.
	ChargeEgress(ctx context.Context, team string, bytes int64, now time.Time) bool
}

var _ Budget = (*tenancy.Quotas)(nil)

// admitFor returns the egress.Options.Admit of sandbox id: its team's
// spent egress refuses its new flows.
func (s *Set) admitFor(id string) func() string {
	return func() string {
		if s.core == nil {
			return ""
		}
		if team, ok := s.core.Team(id); ok && s.budget.EgressSpent(team, time.Now()) {
			return egress.ReasonEgressSpent
		}
		return ""
	}
}

// charge counts a flow's bytes against its sandbox's team; when they
// spend the team's day, every flow open of the team's sandboxes ends.
func (s *Set) charge(ctx context.Context, id string, bytes int64) {
	if s.budget == nil || bytes <= 0 {
		return
	}
	team, ok := s.core.Team(id)
	if !ok || !s.budget.ChargeEgress(ctx, team, bytes, time.Now()) {
		return
	}
	s.mu.Lock()
	refs := make(map[string]*fenceRef, len(s.byID))
	for sid, r := range s.byID {
		refs[sid] = r
	}
	s.mu.Unlock()
	for sid, r := range refs { // the core's lock is not taken under s.mu
		if t, ok := s.core.Team(sid); ok && t == team {
			r.nw.EndFlows()
		}
	}
}
