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
//   - Each renewal first makes the node's reservations in the database
//     those it holds: one whose write was lost or whose answer was (the
//     database failed mid-transaction) is written again or dropped, so a
//     reservation is never leaked for longer than lease/3 while the
//     database answers.
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
	live map[string]held // the reservations the node holds, by ID (holds included)
}

// held is one reservation the node holds.
type held struct {
	team   string
	size   tenancy.Size
	paused bool
}

// New returns the cluster's admission for node, over local (the node's
// own quotas: its limits cache and usage) and st. lease 0 means
// DefaultLease.
func New(local *tenancy.Quotas, st *store.Store, node string, lease time.Duration) *Quotas {
	if lease <= 0 {
		lease = DefaultLease
	}
	return &Quotas{Quotas: local, st: st, node: node, lease: lease, live: map[string]held{}}
}

// Start drops the node's reservations of a previous run: the sandboxes it
// takes over are reserved again by Adopt.
func (q *Quotas) Start(ctx context.Context) error {
	return q.st.DropNodeReservations(ctx, q.node)
}

// Run renews the node's reservations every lease/3 and reloads the
// teams' limits, until ctx ends.
func (q *Quotas) Run(ctx context.Context) {
	t := time.NewTicker(q.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_ = q.Renew(ctx)
		_ = q.Quotas.Load(ctx)
	}
}

// Renew makes the node's reservations in the store those it holds (drops
// the others, writes the missing ones) and pushes their expiry a lease
// ahead.
func (q *Quotas) Renew(ctx context.Context) error {
	ids, err := q.st.NodeReservations(ctx, q.node)
	if err != nil {
		return err
	}
	stored := map[string]bool{}
	for _, id := range ids {
		stored[id] = true
	}
	q.mu.Lock()
	var drop []string
	var write []store.Reservation
	for _, id := range ids {
		if _, ok := q.live[id]; !ok {
			drop = append(drop, id)
		}
	}
	for id, h := range q.live {
		if !stored[id] {
			write = append(write, q.reservation(id, h))
		}
	}
	q.mu.Unlock()
	for _, id := range drop {
		// Held meanwhile (a hold's Reserve that answered after the list)?
		q.mu.Lock()
		_, ok := q.live[id]
		q.mu.Unlock()
		if !ok {
			if err := q.st.ReleaseReservation(ctx, id); err != nil {
				return err
			}
		}
	}
	for _, r := range write {
		q.mu.Lock()
		_, ok := q.live[r.ID]
		q.mu.Unlock()
		if ok {
			if err := q.st.ForceReservation(ctx, r); err != nil {
				return err
			}
		}
	}
	_, err = q.st.RenewReservations(ctx, q.node, time.Now().Add(q.lease))
	return err
}

func (q *Quotas) hold(id string, h held) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.live[id] = h
}

func (q *Quotas) unhold(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.live, id)
}

// ctx bounds one admission's database work.
func (q *Quotas) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

func (q *Quotas) reservation(id string, h held) store.Reservation {
	return store.Reservation{ID: id, Team: h.team, Node: q.node, CPUs: h.size.CPUs, MemoryMB: h.size.MemoryMB,
		Paused: h.paused, Expires: time.Now().Add(q.lease)}
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
	hold, h := "hold-"+store.NewID(), held{team: team, size: size}
	q.hold(hold, h) // before the insert: Renew must not drop it
	if err := q.st.Reserve(ctx, q.reservation(hold, h), q.Defaults()); err != nil {
		q.unhold(hold) // Renew drops it if it was written after all
		return nil, err
	}
	return tenancy.NewHold(func(id string) {
		ctx, cancel := q.ctx()
		defer cancel()
		q.hold(id, h)
		if err := q.st.RenameReservation(ctx, hold, id); err != nil {
			// Renew writes id's and drops the hold's if this fails.
			_ = q.st.ForceReservation(ctx, q.reservation(id, h))
		}
		q.unhold(hold)
		q.Quotas.Adopt(id, team, size, false)
	}, func() {
		ctx, cancel := q.ctx()
		defer cancel()
		q.unhold(hold)
		_ = q.st.ReleaseReservation(ctx, hold)
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
	q.setPaused(id, paused)
	var once sync.Once
	return func() {
		once.Do(func() {
			undoLocal()
			q.setPaused(id, !paused)
			ctx, cancel := q.ctx()
			defer cancel()
			_ = q.st.SetReservationPaused(ctx, id, !paused)
		})
	}, nil
}

func (q *Quotas) setPaused(id string, paused bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if h, ok := q.live[id]; ok {
		h.paused = paused
		q.live[id] = h
	}
}

// Adopt implements tenancy.Admission: the sandbox is reserved whatever
// the limits.
func (q *Quotas) Adopt(id, team string, size tenancy.Size, paused bool) {
	q.Quotas.Adopt(id, team, size, paused)
	h := held{team: team, size: size, paused: paused}
	q.hold(id, h)
	ctx, cancel := q.ctx()
	defer cancel()
	_ = q.st.ForceReservation(ctx, q.reservation(id, h))
}

// Remove implements tenancy.Admission.
func (q *Quotas) Remove(id string) {
	q.Quotas.Remove(id)
	q.unhold(id)
	ctx, cancel := q.ctx()
	defer cancel()
	_ = q.st.ReleaseReservation(ctx, id) // else Renew drops it
}

var _ tenancy.Admission = (*Quotas)(nil)
