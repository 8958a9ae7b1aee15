package tenancy

import (
	"fmt"
	"sync"

	"github.com/fencesandbox/fence/api"
)

// Kept is what a team keeps of one kind of object, as its store tells:
// how many and their bytes.
type Kept struct {
	Count int
	Bytes int64
}

// keptState is the snapshots being taken, by team: admitted, not yet in
// the store (or failed).
type keptState struct {
	mu sync.Mutex // held while a team's store count is read and checked
	// +checklocks:mu
	pending map[string]*Kept
}

// SnapshotHold is the room AdmitSnapshot took for one snapshot being
// taken. Grow adds its bytes once they are known; Done gives the room
// back once the snapshot is in the store (or was not made). A nil
// SnapshotHold (no limit) does nothing.
type SnapshotHold struct {
	q     *Quotas
	team  string
	kept  func() (Kept, error)
	limit Limits
	bytes int64
	once  sync.Once
}

// AdmitSnapshot takes room for one more snapshot of team, or refuses at
// its Snapshots or SnapshotBytes limit with an error wrapping
// api.ErrResourceExhausted. kept reads what the team keeps now, less the
// snapshot a new one replaces (a named snapshot taken again); it is read
// under the lock that the other admits of snapshots take, and the
// snapshots admitted and not yet stored count too, so concurrent
// snapshots never overshoot a limit. nil with no limit set.
func (q *Quotas) AdmitSnapshot(team string, kept func() (Kept, error)) (*SnapshotHold, error) {
	l := q.Limits(team)
	if l.Snapshots == 0 && l.SnapshotBytes == 0 {
		return nil, nil
	}
	q.kept.mu.Lock()
	defer q.kept.mu.Unlock()
	k, err := kept()
	if err != nil {
		return nil, err
	}
	p := q.pendingLocked(team)
	switch {
	case l.Snapshots > 0 && k.Count+p.Count+1 > l.Snapshots:
		return nil, fmt.Errorf("you have reached the maximum number of snapshots (%d): %w", l.Snapshots, api.ErrResourceExhausted)
	case l.SnapshotBytes > 0 && k.Bytes+p.Bytes >= l.SnapshotBytes:
		return nil, errSnapshotBytes(l)
	}
	p.Count++
	return &SnapshotHold{q: q, team: team, kept: kept, limit: l}, nil
}

func errSnapshotBytes(l Limits) error {
	return fmt.Errorf("you have reached the maximum disk of snapshots (%d bytes): %w", l.SnapshotBytes, api.ErrResourceExhausted)
}

// +checklocks:q.kept.mu
func (q *Quotas) pendingLocked(team string) *Kept {
	if q.kept.pending == nil {
		q.kept.pending = map[string]*Kept{}
	}
	p := q.kept.pending[team]
	if p == nil {
		p = &Kept{}
		q.kept.pending[team] = p
	}
	return p
}

// Grow counts the snapshot's bytes, once measured, or refuses them over
// the team's SnapshotBytes with an error wrapping
// api.ErrResourceExhausted (the hold then still needs its Done).
func (h *SnapshotHold) Grow(bytes int64) error {
	if h == nil || h.limit.SnapshotBytes == 0 {
		return nil
	}
	q := h.q
	q.kept.mu.Lock()
	defer q.kept.mu.Unlock()
	k, err := h.kept()
	if err != nil {
		return err
	}
	p := q.pendingLocked(h.team)
	if k.Bytes+p.Bytes+bytes > h.limit.SnapshotBytes {
		return errSnapshotBytes(h.limit)
	}
	p.Bytes += bytes
	h.bytes = bytes
	return nil
}

// Done gives back the room of the hold: its snapshot is in the store, and
// counted there, or was not made. Only the first call counts.
func (h *SnapshotHold) Done() {
	if h == nil {
		return
	}
	h.once.Do(func() {
		q := h.q
		q.kept.mu.Lock()
		defer q.kept.mu.Unlock()
		p := q.pendingLocked(h.team)
		p.Count--
		p.Bytes -= h.bytes
		if *p == (Kept{}) {
			delete(q.kept.pending, h.team)
		}
	})
}
