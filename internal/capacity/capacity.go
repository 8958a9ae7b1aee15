// Package capacity admits a sandbox only when the host can hold it.
//
// A Gate reads the host's limits that, once crossed, kill or cripple the
// sandboxes already running: tasks (processes and threads) against
// kernel.pid_max and kernel.threads-max and the pids.max of fence's own
// cgroup, available memory, the daemon's descriptors (RLIMIT_NOFILE) and
// the system's (fs.file-max), and the disk space and inodes of the data
// dir. A create is admitted only if, for every limit, what is in use plus
// the estimated cost of every sandbox in flight (this one included) plus
// a fixed safety margin stays within the limit.
//
// # Guarantees
//
//   - Check never starts anything; it reads the host and answers.
//   - A refusal wraps api.ErrUnavailable and names the limit, its use and
//     its value, and how to raise it.
//   - CheckPool (sandboxes started ahead of demand) refuses while a user's
//     Check would still pass PoolReserve more times: a warm pool never
//     takes the last headroom.
//   - The refusals given to users are counted by limit (Count, Refused).
package capacity

import (
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/fencesandbox/fence/api"
)

// Limit names a host limit a Gate checks (the metrics' label).
type Limit string

// The limits.
const (
	Tasks       Limit = "tasks"        // kernel.pid_max / kernel.threads-max
	GroupTasks  Limit = "cgroup_pids"  // pids.max of fence's cgroup
	Memory      Limit = "memory"       // MemAvailable
	DaemonFiles Limit = "daemon_files" // the daemon's RLIMIT_NOFILE
	SystemFiles Limit = "system_files" // fs.file-max
	Disk        Limit = "disk"         // the data dir's free space
	Inodes      Limit = "inodes"       // the data dir's free inodes
)

// Limits lists every Limit, in the order they are checked.
var Limits = []Limit{Tasks, GroupTasks, Memory, DaemonFiles, SystemFiles, Disk, Inodes}

// Reading is one limit as the host shows it now.
type Reading struct {
	Limit Limit
	Name  string // what bounds it, e.g. "kernel.pid_max"
	Used  int64
	Max   int64
}

// Source reads the host's limits; a limit it cannot read is left out.
type Source func() []Reading

// Costs are amounts per Limit: what one idle sandbox takes of each (Cost)
// or what must stay free whatever happens (Margin).
type Costs map[Limit]int64

// PerSandbox is what one idle sandbox of the default size takes of each
// limit, measured on a 2-CPU, 24 GiB host (cgroup v1) by starting 10 idle
// "minimal" then 10 idle "base" native sandboxes and reading the host
// before and after (docs/OPERATIONS.md), rounded up with room for a first
// command:
//
//   - Tasks: 10.2 tasks per idle sandbox in its cgroup (init, the agent's
//     Go runtime threads) plus the daemon's threads (13 → 15 for 20
//     sandboxes); 11.3 per sandbox at 2,350 idle ones. Reserved: 16.
//   - GroupTasks: 10.2 ("minimal") and 10.4 ("base") in fence's cgroup.
//     Reserved: 12.
//   - Memory: 12.5 MiB ("minimal") and 6.7 MiB ("base") of MemAvailable.
//     Reserved: 16 MiB.
//   - DaemonFiles: 5 of the daemon's descriptors idle (TUN, lifeline,
//     pidfd, uid slot, writable layer), about twice that while created.
//     Reserved: 16.
//   - SystemFiles: the daemon's 9 plus the sandbox's own (its agent's,
//     under 20); fs.file-nr moves by more than that with the rest of the
//     host. Reserved: 64.
//   - Disk: 94 KiB of the data dir. Reserved: 4 MiB.
//   - Inodes: 6 in the data dir. Reserved: 256.
var PerSandbox = Costs{
	Tasks:       16,
	GroupTasks:  12,
	Memory:      16 << 20,
	DaemonFiles: 16,
	SystemFiles: 64,
	Disk:        4 << 20,
	Inodes:      256,
}

// SafetyMargin is what stays free of each limit for everything that is
// not a new sandbox: the running sandboxes' commands, the daemon's own
// growth (goroutines that lock threads, template builds), sshd and the
// operator's shell. Of the daemon's descriptors that is the idle
// connections its agent and port proxies keep (256 each, package
// httpapi) and the connections of the requests in flight (a client's
// and the proxy's to the sandbox for each), so that a node full of idle
// sandboxes still runs a command in every one.
var SafetyMargin = Costs{
	Tasks:       1024,
	GroupTasks:  64,
	Memory:      512 << 20,
	DaemonFiles: 1024,
	SystemFiles: 4096,
	Disk:        1 << 30,
	Inodes:      16384,
}

// PoolReserve is how many user creates' worth of headroom a warm pool
// leaves untouched: it stops refilling that far before a user is refused.
const PoolReserve = 2

// Options configure a Gate.
type Options struct {
	// Source reads the limits; required.
	Source Source
	// Cost and Margin default to PerSandbox and SafetyMargin; a limit
	// missing from a non-nil map costs nothing.
	Cost, Margin Costs
}

// Gate admits sandboxes against the host's limits. Its methods are safe
// for concurrent use.
type Gate struct {
	source Source
	cost   Costs
	margin Costs

	mu sync.Mutex
	// +checklocks:mu
	refused map[Limit]int64
}

// New returns a Gate.
func New(opts Options) (*Gate, error) {
	if opts.Source == nil {
		return nil, errors.New("capacity.New: Source is required")
	}
	g := &Gate{source: opts.Source, cost: opts.Cost, margin: opts.Margin, refused: map[Limit]int64{}}
	if g.cost == nil {
		g.cost = PerSandbox
	}
	if g.margin == nil {
		g.margin = SafetyMargin
	}
	return g, nil
}

// Left is the number of sandboxes of cost c that fit in r beyond margin
// (never below zero).
func Left(r Reading, cost, margin int64) int64 {
	free := r.Max - r.Used - margin
	if free <= 0 {
		return 0
	}
	if cost <= 0 {
		return free // costs nothing: bounded only by the margin
	}
	return free / cost
}

// Status is the capacity left on the node.
type Status struct {
	// Sandboxes is how many more sandboxes the tightest limit admits,
	// creates in flight not counted.
	Sandboxes int64 `json:"sandboxes"`
	// Limit and Name are the tightest limit and what bounds it.
	Limit Limit  `json:"limit,omitempty"`
	Name  string `json:"name,omitempty"`
	// Readings are the limits as read.
	Readings []Reading `json:"-"`
}

// Status reads the host and returns the capacity left.
func (g *Gate) Status() Status {
	st := Status{Sandboxes: -1}
	st.Readings = g.source()
	for _, r := range st.Readings {
		if r.Max <= 0 {
			continue
		}
		if n := Left(r, g.cost[r.Limit], g.margin[r.Limit]); st.Sandboxes < 0 || n < st.Sandboxes {
			st.Sandboxes, st.Limit, st.Name = n, r.Limit, r.Name
		}
	}
	if st.Sandboxes < 0 {
		st.Sandboxes = 0 // nothing readable: report nothing, admit anything (Check)
	}
	return st
}

// Check admits one more sandbox while inFlight others (admitted, not yet
// running) are being started, or returns a *Refusal.
func (g *Gate) Check(inFlight int) error { return g.check(inFlight, 0) }

// CheckPool admits a sandbox started ahead of demand: it needs PoolReserve
// more sandboxes' headroom than Check.
func (g *Gate) CheckPool(inFlight int) error { return g.check(inFlight, PoolReserve) }

func (g *Gate) check(inFlight, reserve int) error {
	need := int64(inFlight) + 1 + int64(reserve)
	for _, r := range g.source() {
		if r.Max <= 0 {
			continue
		}
		if Left(r, g.cost[r.Limit], g.margin[r.Limit]) >= need {
			continue
		}
		return &Refusal{Reading: r}
	}
	return nil
}

// Count counts err, if it is a *Refusal, as a create refused.
func (g *Gate) Count(err error) {
	var r *Refusal
	if !errors.As(err, &r) {
		return
	}
	g.mu.Lock()
	g.refused[r.Reading.Limit]++
	g.mu.Unlock()
}

// Refused returns the number of creates refused (Count), by limit.
func (g *Gate) Refused() map[Limit]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[Limit]int64, len(g.refused))
	for k, v := range g.refused {
		out[k] = v
	}
	return out
}

// Refusal is a create refused for lack of headroom on one limit. It wraps
// api.ErrUnavailable (HTTP 503).
type Refusal struct{ Reading Reading }

func (e *Refusal) Error() string {
	r := e.Reading
	return fmt.Sprintf("node at capacity: %s of %s %s %s in use; %s: %v",
		amount(r.Limit, r.Used), r.Name, amount(r.Limit, r.Max), unit(r.Limit), hint(r.Limit), api.ErrUnavailable)
}

func (e *Refusal) Unwrap() error { return api.ErrUnavailable }

func unit(l Limit) string {
	switch l {
	case Tasks, GroupTasks:
		return "tasks"
	case Memory:
		return "memory"
	case DaemonFiles, SystemFiles:
		return "open files"
	case Disk:
		return "disk space"
	case Inodes:
		return "inodes"
	}
	return string(l)
}

func hint(l Limit) string {
	switch l {
	case Tasks:
		return "raise pid_max (fence serve --tune-kernel) or run fewer sandboxes"
	case GroupTasks:
		return "raise the pids.max of fence's cgroup or run fewer sandboxes"
	case Memory:
		return "free memory or run fewer sandboxes"
	case DaemonFiles:
		return "raise the daemon's open files limit (LimitNOFILE) or run fewer sandboxes"
	case SystemFiles:
		return "raise fs.file-max or run fewer sandboxes"
	case Disk, Inodes:
		return "free space in the data dir or run fewer sandboxes"
	}
	return "run fewer sandboxes"
}

// amount renders n with thousands separators, bytes in MiB.
func amount(l Limit, n int64) string {
	if l == Memory || l == Disk {
		return group(n>>20) + " MiB"
	}
	return group(n)
}

func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := ""
	if n < 0 {
		neg, s = "-", s[1:]
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return neg + s
}
