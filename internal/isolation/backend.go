// Package isolation defines the one seam between fence's sandbox manager and
// the mechanisms that isolate a sandbox (Linux namespaces, gVisor, microVMs).
//
// A Backend starts sandboxes; each Sandbox runs the fence agent as its first
// process and exposes the agent's HTTP server (envd's protocol) through
// DialAgent. Every backend must pass the conformance suite in
// isolation/isolationtest.
//
// # Guarantees every backend gives
//
//   - Create either returns a running sandbox whose agent answers, or an
//     error after releasing everything it made (processes, mounts, cgroups,
//     directories). A half-made sandbox never survives Create.
//   - Kill is idempotent and leaves nothing behind on the host.
//   - Cleanup removes whatever a crashed daemon left for the given instance,
//     without needing any state in memory.
//   - Nothing the sandbox can write is trusted by the backend.
//   - Nothing of the sandbox runs before its network namespace is attached
//     to the Network of its Spec (its fence), and every namespace the
//     backend makes for it later (a resume, a restore) is attached before
//     anything of the sandbox runs in it. The fence is the owner's: the
//     backend hands over the namespace and closes the Link it got back,
//     exactly once, when the sandbox can no longer send through it.
package isolation

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/fencesandbox/fence/internal/agent/boot"
	"github.com/fencesandbox/fence/internal/netattach"
)

// ErrNotFound is returned for an unknown sandbox.
var ErrNotFound = errors.New("sandbox not found")

// ErrPaused is returned by DialAgent of a paused sandbox, and by a dial
// of a sandbox port while it is paused: nothing inside could answer. It is
// the network contract's (package netattach) own value, which the fence's
// dial of a namespace not attached wraps too.
var ErrPaused = netattach.ErrPaused

// Limits are the kernel-enforced resource limits of one sandbox.
// A zero field means "the backend's default", never "unlimited".
type Limits struct {
	CPUs        float64 // CPU bandwidth in cores (CFS quota / cpu.max)
	MemoryBytes int64   // memory limit, swap included
	Pids        int64   // maximum number of tasks (processes and threads)
	DiskBytes   int64   // writable disk (the overlay upper layer)
	NoFile      uint64  // RLIMIT_NOFILE, clamped to the host's hard limit
}

// DefaultLimits are the built-in limits of a sandbox whose Spec and whose
// daemon's flags leave a limit at zero: the one place every backend and the
// sandbox manager take them from.
var DefaultLimits = Limits{
	CPUs:        1,
	MemoryBytes: 512 << 20,
	Pids:        1024,
	DiskBytes:   1 << 30,
	NoFile:      1024,
}

// WithDefaults returns l with each zero field taken from d.
func (l Limits) WithDefaults(d Limits) Limits {
	if l.CPUs == 0 {
		l.CPUs = d.CPUs
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = d.MemoryBytes
	}
	if l.Pids == 0 {
		l.Pids = d.Pids
	}
	if l.DiskBytes == 0 {
		l.DiskBytes = d.DiskBytes
	}
	if l.NoFile == 0 {
		l.NoFile = d.NoFile
	}
	return l
}

// Bind is a host path made visible inside the sandbox (fence run -v).
type Bind struct {
	HostPath string // absolute, already validated by the caller
	Path     string // absolute path inside the sandbox
	ReadOnly bool
	// Volume, if set, names the fence volume whose root HostPath is (a
	// filesystem of fence's own, under its data dir): it is mounted
	// idmapped through the sandbox's user namespace, so the ids on disk
	// are the ids inside, and CheckBindSource does not apply.
	Volume string
}

// Spec describes a sandbox to create.
type Spec struct {
	// ID is the sandbox ID: [a-z0-9]+, also used as the hostname. Empty
	// means the backend names the sandbox; Sandbox.ID tells the name.
	ID string
	// RootFS is the template's root directory on the host. It is shared by
	// every sandbox made from the template and must never be written.
	RootFS string
	// Limits; zero fields take the backend defaults.
	Limits Limits
	// Binds are extra host paths to mount (only for local `fence run`).
	Binds []Bind
	// Agent is handed to the fence agent inside the sandbox.
	Agent AgentConfig
	// Backend names the backend to create the sandbox on, for a router of
	// several (isolation/multi); empty means the default.
	Backend string
	// Network is the sandbox's network fence, which its owner keeps (the
	// daemon's network side, internal/sandbox/fences: policy, egress
	// proxy, ingress): the backend attaches every network namespace it
	// makes for the sandbox to it, and calls nothing else of the owner.
	// Required.
	Network Network `json:"-"`
	// Background marks a sandbox started ahead of its use (a warm pool's):
	// a backend that can gives it a low CPU weight, so that its start
	// does not slow the sandboxes in use, until Foregrounder.Foreground.
	Background bool
	// Standby marks a sandbox booted ahead to take the place of a live
	// one of the same ID later (the sandbox manager keeps one on a
	// sandbox's last checkpoint, so that a rewind to it is a hand-over,
	// not a boot). It may exist beside that sandbox, and until
	// Foregrounder.Foreground (its hand-over) it ran nothing of the
	// sandbox's: its kill leaves no forensic archive under the ID. Only
	// for sandboxes that implement StandbyBooter.
	Standby bool
}

// StandbyBooter is implemented by sandboxes whose backend boots
// Spec.Standby sandboxes of the same ID, on a layer, cheaply enough for
// the sandbox manager to keep one booted ahead per checkpointed sandbox.
type StandbyBooter interface {
	BootsStandby()
}

// Foregrounder is implemented by sandboxes started with Spec.Background
// that can be given the ordinary CPU weight back, as a warm pool does when
// it hands one out.
type Foregrounder interface {
	Foreground() error
}

// AgentConfig is what the agent inside the sandbox needs to know (see
// package boot, the agent's boot contract).
type AgentConfig = boot.Config

// Network is a sandbox's network fence as its owner keeps it, and Link
// one attached namespace of it: the contract of package netattach, which
// every backend keeps (see the package doc's guarantees).
type (
	Network = netattach.Network
	Link    = netattach.Link
)

// Pauser is implemented by sandboxes that can be paused in place.
//
// Pause stops every process of the sandbox where it is (a frozen cgroup on
// the native backend); memory, files and open descriptors are kept, and
// nothing of the sandbox runs until Resume. While paused, DialAgent fails
// at once with an error wrapping ErrPaused. Resume lets the
// processes run on from where they were. Pausing a paused sandbox and
// resuming a running one do nothing. Kill works in either state and leaves
// nothing behind, and Cleanup after a crash removes a paused sandbox like
// any other. A failed Pause leaves the sandbox running.
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// Adopter is implemented by backends whose paused sandboxes outlive the
// process that paused them, their state being on disk (gVisor's checkpoint
// images). Adopt takes over the paused sandbox id left by an earlier
// instance on the same state: it comes back paused (Resume restores it,
// attaching its new namespace to nw, as Spec.Network), and Cleanup no
// longer counts it as a leftover. A sandbox that cannot be adopted gives
// an error wrapping ErrNotFound.
type Adopter interface {
	Adopt(ctx context.Context, id string, nw Network) (Sandbox, error)
}

// Keeper is implemented by sandboxes whose paused state can outlive the
// daemon (see Adopter): Kept reports whether this one is paused with its
// state safely on disk, so that a daemon shutting down leaves it for the
// next one to adopt instead of killing it.
type Keeper interface {
	Kept() bool
}

// LayerReader is implemented by sandboxes whose writable layer (what the
// sandbox changed against its template) the daemon can read, running or
// paused, for a forensics export.
//
// ExportLayer writes the layer as an uncompressed tar whose entries are
// all under changes/: files, directories, symlinks (as symlinks, never
// followed) and fifos, with the deleted paths (whiteouts) listed in
// changes/.whiteouts. More than limit bytes is an error. LayerSize is
// what ExportLayer would write (headers included) without reading the
// files, for a clear error before an export starts.
type LayerReader interface {
	ExportLayer(ctx context.Context, w io.Writer, limit int64) error
	LayerSize(ctx context.Context) (int64, error)
}

// Stats is a point-in-time resource reading of a sandbox, from the host side.
type Stats struct {
	CPUUsage    time.Duration // cumulative CPU time
	MemoryBytes int64         // current memory use
	MemoryLimit int64
	DiskBytes   int64 // bytes used in the writable layer
	DiskLimit   int64
	Pids        int64
}

// Backend creates sandboxes.
type Backend interface {
	// Name is the backend's name ("native", "gvisor").
	Name() string
	// Create starts a sandbox and returns once its agent accepts connections.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
	// Cleanup kills and removes every sandbox this backend instance left
	// behind (after a crash), and returns the IDs it removed.
	Cleanup(ctx context.Context) ([]string, error)
}

// Sandbox is one running sandbox.
type Sandbox interface {
	ID() string
	// DialAgent opens a new connection to the agent's HTTP server.
	DialAgent(ctx context.Context) (net.Conn, error)
	// Stats reads the sandbox's resource use.
	Stats(ctx context.Context) (Stats, error)
	// Kill stops every process of the sandbox and releases all of its host
	// resources. It is idempotent.
	Kill(ctx context.Context) error
	// Done is closed when the sandbox has stopped (killed, or its agent died).
	Done() <-chan struct{}
}
