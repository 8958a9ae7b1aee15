// Package clusterquota admits sandboxes against their team's limits
// counted over every node that shares one database (fence serve
// --database), so that a team's limits hold for the cluster, not per
// node.
//
// # Guarantees
//
//   - A create, a pause and a resume are admitted by a reservation the
//     store takes in one transaction against the team's limits and every
//     node's live reservations (store.Reserve, MoveReservation): nodes
//     admitting at once never overshoot a limit together.
//   - The team's limits used are those the database holds at that moment,
//     whichever node set them.
//   - Each reservation carries the node's name and an expiry the node
//     pushes forward every lease/3 while it runs (Run); a crashed node's
//     reservations stop counting when the lease runs out. A node starting
//     again drops its old reservations and reserves its sandboxes anew as
//     it takes them over (Adopt).
//   - The rest (this node's usage, builds, request rates, lifetimes) is
//     the node's tenancy.Quotas', which stays in step.
package clusterquota

import (
	"context"
	"sync"
	"time"

	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// DefaultLease is how long a node's reservations outlive its last
// renewal.
const DefaultLease = 30 * time.Second

// Quotas is a tenancy.Admission over a store shared by nodes.
type Quotas struct {
	*tenancy.Quotas
	st    *store.Store
	node  string
	lease time.Duration

	mu sync.Mutex
	// +checklocks:mu
	unreleased map[string]bool // releases that failed, retried by Run
}

// New returns the cluster's admission for node, over local (the node's
// own quotas: its limits cache and usage) and st. lease 0 means
// DefaultLease.
func New(local *tenancy.Quotas, st *store.Store, node string, lease time.Duration) *Quotas {
	if lease <= 0 {
		lease = DefaultLease
	}
	return &Quotas{Quotas: local, st: st, node: node, lease: lease, unreleased: map[string]bool{}}
}

// Start drops the node's reservations of a previous run: the sandboxes it
// takes over are reserved again by Adopt.
func (q *Quotas) Start(ctx context.Context) error {
	return q.st.DropNodeReservations(ctx, q.node)
}

// Run renews the node's reservations every lease/3, retries the releases
// that failed and reloads the teams' limits, until ctx ends.
func (q *Quotas) Run(ctx context.Context) {
	t := time.NewTicker(q.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		q.renew(ctx)
	}
}

func (q *Quotas) renew(ctx context.Context) {
	_, _ = q.st.RenewReservations(ctx, q.node, time.Now().Add(q.lease))
	q.mu.Lock()
	ids := make([]string, 0, len(q.unreleased))
	for id := range q.unreleased {
		ids = append(ids, id)
	}
	q.mu.Unlock()
	for _, id := range ids {
		q.release(ctx, id)
	}
	_ = q.Quotas.Load(ctx)
}

// release drops reservation id, or keeps it for Run to retry.
func (q *Quotas) release(ctx context.Context, id string) {
	err := q.st.ReleaseReservation(ctx, id)
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil {
		q.unreleased[id] = true
	} else {
		delete(q.unreleased, id)
	}
}

// ctx bounds one admission's database work.
func (q *Quotas) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

func (q *Quotas) reservation(id, team string, size tenancy.Size, paused bool) store.Reservation {
	return store.Reservation{ID: id, Team: team, Node: q.node, CPUs: size.CPUs, MemoryMB: size.MemoryMB,
		Paused: paused, Expires: time.Now().Add(q.lease)}
}

// Admit implements tenancy.Admission: the size is checked against the
// team's limits, then one more running sandbox reserved in the store.
// The hold's Commit gives the reservation the sandbox's ID.
func (q *Quotas) Admit(team string, size tenancy.Size) (*tenancy.Hold, error) {
	if err := tenancy.CheckSize(q.Limits(team), size); err != nil {
		return nil, err
	}
	ctx, cancel := q.ctx()
	defer cancel()
	hold := "hold-" + store.NewID()
	if err := q.st.Reserve(ctx, q.reservation(hold, team, size, false), q.Defaults()); err != nil {
		return nil, err
	}
	return tenancy.NewHold(func(id string) {
		ctx, cancel := q.ctx()
		defer cancel()
		if err := q.st.RenameReservation(ctx, hold, id); err != nil {
			// Keep the count right under the sandbox's ID.
			_ = q.st.ForceReservation(ctx, q.reservation(id, team, size, false))
			q.release(ctx, hold)
		}
		q.Quotas.Adopt(id, team, size, false)
	}, func() {
		ctx, cancel := q.ctx()
		defer cancel()
		q.release(ctx, hold)
	}), nil
}

// Pause implements tenancy.Admission.
func (q *Quotas) Pause(id string) (func(), error) {
	return q.move(id, true, q.Quotas.Pause)
}

// Resume implements tenancy.Admission.
func (q *Quotas) Resume(id string) (func(), error) {
	return q.move(id, false, q.Quotas.Resume)
}

func (q *Quotas) move(id string, paused bool, local func(string) (func(), error)) (func(), error) {
	undoLocal, err := local(id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := q.ctx()
	defer cancel()
	if err := q.st.MoveReservation(ctx, id, paused, q.Defaults()); err != nil {
		undoLocal()
		return nil, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			undoLocal()
			ctx, cancel := q.ctx()
			defer cancel()
			_ = q.st.SetReservationPaused(ctx, id, !paused)
		})
	}, nil
}

// Adopt implements tenancy.Admission: the sandbox is reserved whatever
// the limits.
func (q *Quotas) Adopt(id, team string, size tenancy.Size, paused bool) {
	q.Quotas.Adopt(id, team, size, paused)
	ctx, cancel := q.ctx()
	defer cancel()
	_ = q.st.ForceReservation(ctx, q.reservation(id, team, size, paused))
}

// Remove implements tenancy.Admission.
func (q *Quotas) Remove(id string) {
	q.Quotas.Remove(id)
	ctx, cancel := q.ctx()
	defer cancel()
	q.release(ctx, id)
}

var _ tenancy.Admission = (*Quotas)(nil)
