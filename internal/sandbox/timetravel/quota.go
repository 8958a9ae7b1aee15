package timetravel

import (
	"context"

	"github.com/fencesandbox/fence/internal/tenancy"
)

// SnapshotQuota admits a team's snapshots against its Snapshots and
// SnapshotBytes limits; *tenancy.Quotas implements it.
type SnapshotQuota interface {
	AdmitSnapshot(team string, kept func() (tenancy.Kept, error)) (*tenancy.SnapshotHold, error)
}

var _ SnapshotQuota = (*tenancy.Quotas)(nil)

// SnapshotCounter tells what a team's snapshots take; *store.Store
// implements it. A LayerStore without it is not limited.
type SnapshotCounter interface {
	SnapshotUsage(ctx context.Context, team, except string) (tenancy.Kept, error)
}

// admitSnapshot takes room in ctx's team's quota for a snapshot named
// name ("" unnamed; a named one replaces that name's). A nil hold
// limits nothing.
func (k *Keeper) admitSnapshot(ctx context.Context, name string) (*tenancy.SnapshotHold, error) {
	counter, ok := k.store.(SnapshotCounter)
	if k.quota == nil || !ok {
		return nil, nil
	}
	team := tenancy.TeamOf(ctx)
	return k.quota.AdmitSnapshot(team, func() (tenancy.Kept, error) {
		return counter.SnapshotUsage(context.WithoutCancel(ctx), team, name)
	})
}
