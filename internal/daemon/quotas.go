package daemon

import (
	"cmp"
	"context"
	"os"
	"time"

	"github.com/fencesandbox/fence/internal/metrics"

	"github.com/fencesandbox/fence/internal/tenancy"
	"github.com/fencesandbox/fence/internal/tenancy/clusterquota"
)

// openQuotas loads the teams' own limits from the store, over the
// daemon-wide defaults (Config.TeamLimits). What the teams' sandboxes
// take is counted by the sandbox manager as it registers, takes over and
// removes them, so that the counts after a restart are those of the
// sandboxes it took over.
func (d *node) openQuotas(ctx context.Context) error {
	q, err := tenancy.NewQuotas(d.st, d.opts.TeamLimits)
	if err != nil {
		return err
	}
	if err := q.Load(ctx); err != nil {
		return err
	}
	d.quotas, d.admission = q, q
	// Closed before the store and after the sandboxes (closers run in
	// reverse): the day's egress charged since the last flush is stored.
	d.closers.push(func() {
		if err := q.FlushEgress(context.WithoutCancel(ctx)); err != nil {
			d.log.Warn("storing the teams' egress of the day", "err", err)
		}
	})
	registerTeamMetrics(d.reg, q)
	if d.st.Shared() {
		// The nodes sharing the database hold the teams' limits together.
		cq := clusterquota.New(q, d.st, d.nodeName(), 0)
		if err := cq.Start(ctx); err != nil {
			return err
		}
		go cq.Run(ctx)
		d.admission = cq
	}
	return nil
}

// nodeName is the node's name in its cluster, else the host's name: what
// its quota reservations carry.
func (d *node) nodeName() string {
	if d.opts.Cluster != nil && d.opts.Cluster.Name != "" {
		return d.opts.Cluster.Name
	}
	h, _ := os.Hostname()
	return cmp.Or(h, "fence")
}

// registerTeamMetrics serves the teams' figures labelled by team (one
// series per team and figure, never per sandbox).
func registerTeamMetrics(reg *metrics.Registry, q *tenancy.Quotas) {
	if reg == nil {
		return
	}
	gauge := func(name, help string, v func(tenancy.Usage) float64) {
		reg.GaugeVecFunc(name, help, func() []metrics.Value {
			var out []metrics.Value
			for team, u := range q.TeamUsages() {
				out = append(out, metrics.Value{Labels: []string{"team", team}, V: v(u)})
			}
			return out
		})
	}
	gauge("fence_team_sandboxes_running", "Running sandboxes of each team (creates in flight included).", func(u tenancy.Usage) float64 { return float64(u.Running) })
	gauge("fence_team_sandboxes_paused", "Paused sandboxes of each team.", func(u tenancy.Usage) float64 { return float64(u.Paused) })
	gauge("fence_team_vcpus", "vCPUs of each team's running sandboxes.", func(u tenancy.Usage) float64 { return u.CPUs })
	gauge("fence_team_memory_mib", "Memory (MiB) of each team's running sandboxes.", func(u tenancy.Usage) float64 { return float64(u.MemoryMB) })
	reg.CounterVecFunc("fence_team_sandbox_starts_total", "Sandbox starts (creates, forks, resumes) admitted of each team since the daemon started.", func() []metrics.Value {
		var out []metrics.Value
		for team, n := range q.TeamStarts() {
			out = append(out, metrics.Value{Labels: []string{"team", team}, V: float64(n)})
		}
		return out
	})
	reg.GaugeVecFunc("fence_team_egress_bytes_today", "Bytes each team's ended flows moved through the egress fence this UTC day.", func() []metrics.Value {
		var out []metrics.Value
		now := time.Now()
		for team, n := range q.EgressAllToday(now) {
			out = append(out, metrics.Value{Labels: []string{"team", team}, V: float64(n)})
		}
		return out
	})
}

// teamSecrets is the number of secrets team may keep (0: no limit): its
// limits' Secrets once the quotas are open (before any request).
func (d *node) teamSecrets(team string) int {
	if d.quotas == nil {
		return 0
	}
	return d.quotas.Limits(team).Secrets
}
