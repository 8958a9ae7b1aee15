package daemon

import (
	"context"
	"fmt"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/approvals"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/metrics"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
)

// newApprovals makes the egress approval queue: a "sandbox" decision adds
// the name to the sandbox's policy through nets (bound later: the queue
// is made before the network side that asks it), a "team" decision
// approves it for every sandbox of the request's team, and every
// decision is recorded in the audit trail with who made it.
func newApprovals(o Config, sink audit.Sink, reg *metrics.Registry, nets func() *fences.Set) *approvals.Queue {
	q := approvals.New(approvals.Options{
		Timeout:    o.ApprovalTimeout,
		PerSandbox: o.ApprovalsPerSandbox,
		Apply: func(ctx context.Context, r approvals.Request) error {
			switch r.Decision {
			case approvals.Sandbox:
				return nets().AllowName(ctx, r.SandboxID, r.Name)
			case approvals.Team:
				if r.TeamID == "" {
					return fmt.Errorf("decision team: sandbox %s has no team: %w", r.SandboxID, api.ErrConflict)
				}
				return nets().AllowTeamName(ctx, r.TeamID, r.SandboxID, r.Name, r.Actor)
			}
			return nil
		},
		Decided: func(r approvals.Request) {
			actor := r.Actor
			if actor == "" {
				actor = "daemon"
			}
			if sink != nil {
				sink.Append(context.Background(), audit.Event{Type: audit.TypeApproval, SandboxID: r.SandboxID, Actor: actor,
					Data: map[string]any{"id": r.ID, "name": r.Name, "decision": string(r.Decision), "team": r.TeamID}})
			}
		},
	})
	reg.GaugeFunc("fence_egress_approvals_pending", "Egress approval requests waiting for a decision.", func() int64 { return int64(q.Stats().Pending) })
	for _, c := range []struct {
		name, help string
		v          func(approvals.Stats) int64
	}{
		{"fence_egress_approvals_asked_total", "Egress approval requests made.", func(s approvals.Stats) int64 { return s.Asked }},
		{"fence_egress_approvals_refused_total", "Lookups refused at once because their sandbox (or the daemon) had too many pending approval requests.", func(s approvals.Stats) int64 { return s.Refused }},
		{"fence_egress_approvals_allowed_total", "Egress approval requests decided once, sandbox or team.", func(s approvals.Stats) int64 { return s.Allowed }},
		{"fence_egress_approvals_denied_total", "Egress approval requests decided deny.", func(s approvals.Stats) int64 { return s.Denied }},
		{"fence_egress_approvals_timed_out_total", "Egress approval requests nobody decided in time (or whose sandbox went away).", func(s approvals.Stats) int64 { return s.TimedOut }},
	} {
		reg.CounterFunc(c.name, c.help, func() int64 { return c.v(q.Stats()) })
	}
	return q
}
