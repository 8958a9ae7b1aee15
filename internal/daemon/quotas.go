package daemon

import (
	"cmp"
	"context"
	"os"

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
