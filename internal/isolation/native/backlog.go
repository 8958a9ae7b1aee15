package native

import (
	"context"
	"sync"
	"time"
)

// backlog counts the killed sandboxes whose host resources (cgroup,
// writable layer, loop device, state) are still to be released. It is the
// budget of the teardown that Kill leaves behind it: a Kill that would
// take it past its maximum waits for a release to finish, and a Create
// waits while it stands above half of it (see Backend.Create), so a flood
// of kills can neither pile up unbounded pending teardown nor starve it
// with new sandboxes.
type backlog struct {
	mu sync.Mutex
	// +checklocks:mu
	n int
	// +checklocks:mu
	max int
	// wake is closed (and replaced) whenever n falls.
	// +checklocks:mu
	wake chan struct{}
}

func newBacklog(max int) *backlog {
	return &backlog{max: max, wake: make(chan struct{})}
}

// add counts one more pending release, waiting while the backlog is full.
// It does not give up: a release always ends (each is bounded by
// reapTimeout), and the sandbox is already dead, so the only alternative
// would be to drop its resources unaccounted.
func (q *backlog) add() {
	for {
		q.mu.Lock()
		if q.n < q.max {
			q.n++
			q.mu.Unlock()
			return
		}
		w := q.wake
		q.mu.Unlock()
		<-w
	}
}

// done counts one pending release as finished.
func (q *backlog) done() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.n--
	close(q.wake)
	q.wake = make(chan struct{})
}

// len returns the number of pending releases.
func (q *backlog) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// waitRoom returns once fewer than half of the backlog's maximum releases
// are pending, or with ctx's error and the number pending.
func (q *backlog) waitRoom(ctx context.Context) (int, error) {
	for {
		q.mu.Lock()
		n, limit, w := q.n, max(1, q.max/2), q.wake
		q.mu.Unlock()
		if n < limit {
			return n, nil
		}
		select {
		case <-w:
		case <-ctx.Done():
			return n, ctx.Err()
		}
	}
}

// setMax changes the maximum (tests only, before any Kill).
func (q *backlog) setMax(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.max = n
}

// waitEmpty returns once no release is pending, or with ctx's error.
func (q *backlog) waitEmpty(ctx context.Context) error {
	for {
		q.mu.Lock()
		n, w := q.n, q.wake
		q.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WaitReleased returns once the host resources of every killed sandbox
// have been released (the teardown Kill leaves behind it is done), or
// with ctx's error. `fence bench` times the teardown with it.
func (b *Backend) WaitReleased(ctx context.Context) error { return b.pending.waitEmpty(ctx) }

// ReleaseTimes sums the steps of the background releases of killed
// sandboxes (after Kill has answered), for `fence bench`.
type ReleaseTimes struct {
	// N is the number of releases finished.
	N int
	// Exit is the wait for the sandbox's processes to exit, including the
	// kernel's teardown of its namespaces (mount, network, pid, user).
	Exit time.Duration
	// Cgroup is the removal of its cgroups (a grace period of RCU per
	// hierarchy on cgroup v1).
	Cgroup time.Duration
	// Archive is the archive of its writable layer for forensics.
	Archive time.Duration
	// Rest is the release of its writable layer (unmount, loop device),
	// socket, state directory and uid slot.
	Rest time.Duration
}

type releaseTimes struct {
	mu sync.Mutex
	// +checklocks:mu
	t ReleaseTimes
}

func (r *releaseTimes) add(exit, cg, archive, rest time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.t.N++
	r.t.Exit += exit
	r.t.Cgroup += cg
	r.t.Archive += archive
	r.t.Rest += rest
}

// ReleaseTimes returns the sums of the steps of the releases finished so
// far.
func (b *Backend) ReleaseTimes() ReleaseTimes {
	b.releaseTimes.mu.Lock()
	defer b.releaseTimes.mu.Unlock()
	return b.releaseTimes.t
}
