package tenancy

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
)

// Size is what one sandbox takes of its team's quota.
type Size struct {
	CPUs     float64
	MemoryMB int64
	DiskMB   int64
	Timeout  time.Duration // its lifetime asked at create (0: not checked)
}

// Admission is the quota the sandbox manager asks before a sandbox of a
// team starts, pauses or resumes, and tells of each sandbox it takes
// over or removes. Quotas implements it.
type Admission interface {
	// Admit takes room for one more running sandbox of team, or refuses
	// with an error wrapping api.ErrResourceExhausted (a limit of the
	// team's is reached) or api.ErrInvalidArgument (size alone is over a
	// limit). The room is the sandbox's once the Hold is committed, and
	// given back if it is cancelled.
	Admit(team string, size Size) (*Hold, error)
	// Pause moves sandbox id from running to paused, refused at the
	// team's paused limit; undo moves it back (the pause failed).
	Pause(id string) (undo func(), err error)
	// Resume moves sandbox id from paused to running, refused at the
	// team's running limits; undo moves it back (the resume failed).
	Resume(id string) (undo func(), err error)
	// CheckTimeout refuses a timeout of sandbox id longer than its team's
	// MaxLifetimeSeconds, with an error wrapping api.ErrInvalidArgument.
	CheckTimeout(id string, d time.Duration) error
	// Adopt counts a sandbox no create admitted (one taken over from a
	// previous daemon), whatever the limits: it exists already.
	Adopt(id, team string, size Size, paused bool)
	// Remove gives back what sandbox id takes. Unknown IDs are ignored.
	Remove(id string)
}

// Usage is what a team's sandboxes take now: running ones (creates in
// flight included) and paused ones.
type Usage struct {
	Running  int     `json:"running"`
	Paused   int     `json:"paused"`
	CPUs     float64 `json:"vcpus"`
	MemoryMB int64   `json:"memoryMB"`
}

// LimitsStore keeps the teams' own limits.
type LimitsStore interface {
	TeamLimits(ctx context.Context) (map[string]Limits, error)
	SetTeamLimits(ctx context.Context, team string, l Limits) error
}

// Quotas holds the teams' limits (a team's own, else the daemon-wide
// defaults) and what each team's sandboxes take, and admits sandboxes
// against them. Every check and the count it guards change under one
// lock, so concurrent creates never overshoot a limit. Its methods are
// safe for concurrent use.
type Quotas struct {
	store    LimitsStore // nil: limits live in memory only
	defaults Limits

	setMu sync.Mutex // serialises Set: the store and memory change in its order

	mu sync.Mutex
	// +checklocks:mu
	teams map[string]Limits // teams' own limits
	// +checklocks:mu
	use map[string]*Usage // by team; holds included
	// +checklocks:mu
	boxes map[string]*box // by sandbox ID
	// +checklocks:mu
	builds map[string]int // template builds in progress, by team
	// +checklocks:mu
	buckets map[string]*bucket // by team and key
	// +checklocks:mu
	pruneAt int // the number of buckets the next pruning waits for

	// +checklocks:mu
	series map[string]*teamSeries // the teams' metrics over time (series.go)

	kept   keptState   // snapshots being taken (kept.go)
	egress egressState // the teams' egress of the day (egress.go)
}

type box struct {
	team   string
	size   Size
	paused bool
}

// NewQuotas returns Quotas with defaults for the teams without limits of
// their own, kept in store (nil: in memory only). Call Load before use
// when store is set.
func NewQuotas(store LimitsStore, defaults Limits) (*Quotas, error) {
	if err := defaults.Validate(); err != nil {
		return nil, fmt.Errorf("default limits: %w", err)
	}
	return &Quotas{store: store, defaults: defaults, teams: map[string]Limits{},
		use: map[string]*Usage{}, boxes: map[string]*box{}, builds: map[string]int{}, buckets: map[string]*bucket{}}, nil
}

// Load reads the teams' limits from the store.
func (q *Quotas) Load(ctx context.Context) error {
	if q.store == nil {
		return nil
	}
	teams, err := q.store.TeamLimits(ctx)
	if err != nil {
		return fmt.Errorf("loading team limits: %w", err)
	}
	q.mu.Lock()
	q.teams = teams
	q.mu.Unlock()
	if err := q.loadEgress(ctx, time.Now()); err != nil {
		return fmt.Errorf("loading the teams' egress of the day: %w", err)
	}
	return nil
}

// Defaults returns the daemon-wide limits.
func (q *Quotas) Defaults() Limits { return q.defaults }

// Limits returns team's limits in force.
func (q *Quotas) Limits(team string) Limits {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.limitsLocked(team)
}

// +checklocks:q.mu
func (q *Quotas) limitsLocked(team string) Limits {
	if l, ok := q.teams[team]; ok {
		return l
	}
	return q.defaults
}

// Set makes l team's limits, in the store first. An invalid l changes
// nothing. Sandboxes over the new limits keep running; new ones wait
// until the team is under them.
func (q *Quotas) Set(ctx context.Context, team string, l Limits) error {
	if err := l.Validate(); err != nil {
		return err
	}
	q.setMu.Lock()
	defer q.setMu.Unlock()
	if q.store != nil {
		if err := q.store.SetTeamLimits(ctx, team, l); err != nil {
			return err
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.teams[team] = l
	return nil
}

// Usage returns what team's sandboxes take now.
func (q *Quotas) Usage(team string) Usage {
	q.mu.Lock()
	defer q.mu.Unlock()
	if u := q.use[team]; u != nil {
		return *u
	}
	return Usage{}
}

// RunningCounts returns the number of running sandboxes of each team
// that has any (E2B's admin running counts: zeros left out).
func (q *Quotas) RunningCounts() map[string]int {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := map[string]int{}
	for team, u := range q.use {
		if u.Running > 0 {
			out[team] = u.Running
		}
	}
	return out
}

// +checklocks:q.mu
func (q *Quotas) usageLocked(team string) *Usage {
	u := q.use[team]
	if u == nil {
		u = &Usage{}
		q.use[team] = u
	}
	return u
}

// +checklocks:q.mu
func (q *Quotas) dropIfIdleLocked(team string) {
	if u := q.use[team]; u != nil && *u == (Usage{}) {
		delete(q.use, team)
	}
}

// Hold is room Admit took for one sandbox: Commit gives it to the
// sandbox, Cancel gives it back. Only the first of them counts.
type Hold struct {
	q    *Quotas
	team string
	size Size
	once sync.Once
	// commit and cancel, when set, are what Commit and Cancel do instead
	// (NewHold).
	commit func(id string)
	cancel func()
}

// NewHold returns a Hold whose Commit calls commit and whose Cancel calls
// cancel (only the first of them, once): for an Admission of its own.
func NewHold(commit func(id string), cancel func()) *Hold {
	return &Hold{commit: commit, cancel: cancel}
}

// Commit makes the hold sandbox id's. A nil Hold does nothing.
func (h *Hold) Commit(id string) {
	if h == nil {
		return
	}
	h.once.Do(func() {
		if h.commit != nil {
			h.commit(id)
			return
		}
		h.q.mu.Lock()
		defer h.q.mu.Unlock()
		h.q.boxes[id] = &box{team: h.team, size: h.size}
	})
}

// Cancel gives the hold back. A nil Hold does nothing.
func (h *Hold) Cancel() {
	if h == nil {
		return
	}
	h.once.Do(func() {
		if h.cancel != nil {
			h.cancel()
			return
		}
		h.q.mu.Lock()
		defer h.q.mu.Unlock()
		h.q.addLocked(h.team, h.size, false, -1)
	})
}

// +checklocks:q.mu
func (q *Quotas) addLocked(team string, s Size, paused bool, n int) {
	u := q.usageLocked(team)
	if paused {
		u.Paused += n
	} else {
		u.Running += n
		u.CPUs += float64(n) * s.CPUs
		u.MemoryMB += int64(n) * s.MemoryMB
		if math.Abs(u.CPUs) < 1e-9 {
			u.CPUs = 0
		}
		q.noteRunningLocked(team, u.Running)
	}
	q.dropIfIdleLocked(team)
}

// Admit implements Admission.
func (q *Quotas) Admit(team string, size Size) (*Hold, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.limitsLocked(team)
	if err := checkSize(l, size); err != nil {
		return nil, err
	}
	if err := q.checkRunLocked(team, l, size); err != nil {
		return nil, err
	}
	q.addLocked(team, size, false, 1)
	q.noteStartLocked(team)
	return &Hold{q: q, team: team, size: size}, nil
}

// CheckSize refuses a sandbox that alone is over one of l, with E2B's
// messages where E2B has one (errors wrapping api.ErrInvalidArgument).
func CheckSize(l Limits, s Size) error { return checkSize(l, s) }

// CheckRun refuses one more running sandbox of size s for a team using u,
// at one of l's running limits, with E2B's message for the concurrency
// one (errors wrapping api.ErrResourceExhausted).
func CheckRun(l Limits, u Usage, s Size) error {
	switch {
	case l.ConcurrentSandboxes > 0 && u.Running+1 > l.ConcurrentSandboxes:
		return fmt.Errorf("you have reached the maximum number of concurrent E2B sandboxes (%d). If you need more, please visit 'https://e2b.dev/docs/billing': %w",
			l.ConcurrentSandboxes, api.ErrResourceExhausted)
	case l.VCPUs > 0 && u.CPUs+s.CPUs > l.VCPUs+1e-9:
		return fmt.Errorf("you have reached the maximum number of vCPUs of running sandboxes (%v in use, %v asked, limit %v): %w",
			u.CPUs, s.CPUs, l.VCPUs, api.ErrResourceExhausted)
	case l.MemoryMB > 0 && u.MemoryMB+s.MemoryMB > l.MemoryMB:
		return fmt.Errorf("you have reached the maximum memory of running sandboxes (%d MiB in use, %d MiB asked, limit %d MiB): %w",
			u.MemoryMB, s.MemoryMB, l.MemoryMB, api.ErrResourceExhausted)
	}
	return nil
}

// CheckPause refuses one more paused sandbox for a team using u at l's
// PausedSandboxes (an error wrapping api.ErrResourceExhausted).
func CheckPause(l Limits, u Usage) error {
	if l.PausedSandboxes > 0 && u.Paused+1 > l.PausedSandboxes {
		return fmt.Errorf("you have reached the maximum number of paused sandboxes (%d): %w", l.PausedSandboxes, api.ErrResourceExhausted)
	}
	return nil
}

func checkSize(l Limits, s Size) error {
	switch {
	case l.VCPUs > 0 && s.CPUs > l.VCPUs:
		return fmt.Errorf("CPU count can't be higher than %v (the team's limit of vCPUs): %w", l.VCPUs, api.ErrInvalidArgument)
	case l.MemoryMB > 0 && s.MemoryMB > l.MemoryMB:
		//lint:ignore ST1005 E2B's message, word for word
		return fmt.Errorf("Memory can't be higher than %d MiB (the team's limit of memory): %w", l.MemoryMB, api.ErrInvalidArgument)
	case l.DiskMB > 0 && s.DiskMB > l.DiskMB:
		return fmt.Errorf("disk size can't be higher than %d MiB (the team's limit per sandbox): %w", l.DiskMB, api.ErrInvalidArgument)
	case l.MaxLifetimeSeconds > 0 && s.Timeout > l.MaxLifetime():
		return fmt.Errorf("timeout can't be longer than %d seconds (the team's maximum sandbox lifetime): %w", l.MaxLifetimeSeconds, api.ErrInvalidArgument)
	}
	return nil
}

// checkRunLocked refuses one more running sandbox of size at one of
// team's running limits, with E2B's message for the concurrency one.
//
// +checklocks:q.mu
func (q *Quotas) checkRunLocked(team string, l Limits, s Size) error {
	var u Usage
	if p := q.use[team]; p != nil {
		u = *p
	}
	return CheckRun(l, u, s)
}

// Pause implements Admission.
func (q *Quotas) Pause(id string) (func(), error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	b := q.boxes[id]
	if b == nil || b.paused {
		return func() {}, nil
	}
	var u Usage
	if p := q.use[b.team]; p != nil {
		u = *p
	}
	if err := CheckPause(q.limitsLocked(b.team), u); err != nil {
		return nil, err
	}
	q.moveLocked(b, true)
	return q.undo(id, false), nil
}

// Resume implements Admission.
func (q *Quotas) Resume(id string) (func(), error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	b := q.boxes[id]
	if b == nil || !b.paused {
		return func() {}, nil
	}
	if err := q.checkRunLocked(b.team, q.limitsLocked(b.team), b.size); err != nil {
		return nil, err
	}
	q.moveLocked(b, false)
	q.noteStartLocked(b.team)
	return q.undo(id, true), nil
}

// undo returns a func putting sandbox id back to paused (or running),
// whatever the limits, once.
func (q *Quotas) undo(id string, paused bool) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			if b := q.boxes[id]; b != nil && b.paused != paused {
				q.moveLocked(b, paused)
			}
		})
	}
}

// +checklocks:q.mu
func (q *Quotas) moveLocked(b *box, paused bool) {
	q.addLocked(b.team, b.size, b.paused, -1)
	b.paused = paused
	q.addLocked(b.team, b.size, b.paused, 1)
}

// CheckTimeout implements Admission.
func (q *Quotas) CheckTimeout(id string, d time.Duration) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	b := q.boxes[id]
	if b == nil {
		return nil
	}
	return checkSize(q.limitsLocked(b.team), Size{Timeout: d})
}

// AdmitBuild takes room for one more template build of team, or refuses
// at its ConcurrentBuilds with E2B's message, wrapping
// api.ErrResourceExhausted. release gives the room back (once).
func (q *Quotas) AdmitBuild(team string) (release func(), err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if l := q.limitsLocked(team); l.ConcurrentBuilds > 0 && q.builds[team] >= l.ConcurrentBuilds {
		return nil, fmt.Errorf("you have reached the maximum number of concurrent template builds (%d). Please wait for one of them to finish: %w",
			l.ConcurrentBuilds, api.ErrResourceExhausted)
	}
	q.builds[team]++
	var once sync.Once
	return func() {
		once.Do(func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			if q.builds[team]--; q.builds[team] <= 0 {
				delete(q.builds, team)
			}
		})
	}, nil
}

// Adopt implements Admission.
func (q *Quotas) Adopt(id, team string, size Size, paused bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.boxes[id] != nil {
		return
	}
	q.boxes[id] = &box{team: team, size: size, paused: paused}
	q.addLocked(team, size, paused, 1)
}

// Remove implements Admission.
func (q *Quotas) Remove(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	b := q.boxes[id]
	if b == nil {
		return
	}
	delete(q.boxes, id)
	q.addLocked(b.team, b.size, b.paused, -1)
}

var _ Admission = (*Quotas)(nil)
