package daemon

import (
	"context"

	"github.com/fencesandbox/fence/internal/tenancy"
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
	d.quotas = q
	return nil
}

// teamSecrets is the number of secrets team may keep (0: no limit): its
// limits' Secrets once the quotas are open (before any request).
func (d *node) teamSecrets(team string) int {
	if d.quotas == nil {
		return 0
	}
	return d.quotas.Limits(team).Secrets
}
