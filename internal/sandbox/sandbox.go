// Package sandbox is fence's domain core: the Manager owns the lifecycle of
// every sandbox (create, deadlines, pause and resume, kill, crash
// recovery) on top of an isolation.Backend and the persistent store.
//
// # The core
//
// The lifecycle core is the registry of live sandboxes (the Manager's
// running map, an entry per sandbox, running or paused), their state
// machine (running ⇄ paused, then killed), their store record, and two
// types it uses that own their state and never call back into it:
// admission (admission.go), which counts the units of
// Options.MaxSandboxes in use and asks the host for headroom, and the
// reaper (reaper.go), which sleeps until the earliest deadline it knows
// and has the Manager kill or pause what is due. A create (create.go)
// runs in steps, each on what the ones before it left: plan (checks,
// changes nothing), admission, configure, boot, ready, record, register.
// Pauses (pause.go) owns the pause and resume of live sandboxes, both
// kinds (in place, with the memory; filesystem-only, on a layer), and
// reaches the registry through a narrow seam (pauseCore), as adoption
// (adopt.go) does through adoptCore.
//
// # Surface
//
// What the Manager answers, all of it safe for concurrent use:
//
//   - its own life: Start (crash recovery, adoption, the reaper and the
//     usage sampler) and Shutdown;
//   - a sandbox's life: Create (create.go), SetTimeout, Extend and Kill
//     (ops.go); pause and resume are Pauses' (Pause, Resume, Connect and
//     WakeOnTraffic, each asking WithMemory or WithoutMemory);
//   - reads: Get (a live sandbox's record), Live (its record and backend
//     sandbox read together, for the traffic proxy and an export),
//     MatchToken (the sandbox whose envd access token a check accepts),
//     List (the store's records, paged) and Counts (running, paused);
//   - what the daemon sizes the rest on: Defaults, WarmTarget
//     (runtime.go), Capacity, CreatesInFlight and PoolBudget
//     (admission.go), and Meter (usage and metrics, package usage).
//
// The other parts of the daemon reach the core only through values it
// hands them: LayerPort and Live (the keeper of layers, layers.go),
// fences.Core (the network side, network.go) and usage.Live (the
// Meter, usage.go).
//
// # Guarantees
//
//   - Create validates its input before touching anything: bad input gets an
//     error wrapping api.ErrInvalidArgument (or api.ErrNotFound for an
//     unknown template) and changes nothing. If the backend or the store
//     fails half-way, whatever was made is taken back (the backend
//     sandbox killed, its fence, gateway state and unit of admission
//     released) and no record remains in state running.
//   - At most Options.MaxSandboxes sandboxes are live (running or paused),
//     being created, being killed (until the backend has released them),
//     or held ahead of demand by a warm pool (PoolBudget) at once. At the
//     cap, Create takes a unit back from the pool (which kills one of its
//     sandboxes first); beyond that it fails with api.ErrResourceExhausted.
//     With Options.Capacity, a create (and the resume of a
//     filesystem-only pause) is admitted only with the host's headroom
//     for it beside every create in flight; a refusal names the limit.
//   - A sandbox is killed at its deadline (EndAt) by the reaper, or paused
//     there if it was created with AutoPause, and marked killed when its
//     Done channel closes on its own (the agent died). The reaper learns of
//     a new or moved deadline without going over the others, so a create
//     costs the same however many sandboxes are alive.
//   - A paused sandbox (Pause, on a backend whose sandboxes implement
//     isolation.Pauser) keeps its memory, files, processes, ID and envd
//     access token; it has no deadline while paused (its EndAt is the time
//     it was paused), takes no traffic (Live shows it paused, and
//     RunDone of the run it ended is closed), and still counts against
//     MaxSandboxes. Resume (or Connect) starts a new run: StartedAt is the
//     resume time and EndAt the resume time plus the timeout given.
//   - A running sandbox with an IdleTimeout that had no traffic, no SSH
//     session and no CPU use for that long (Options.Idle, package idle) is
//     paused with its memory; traffic, Connect, Resume, SetTimeout and
//     Extend resume it, and its EndAt is the resume time plus what its
//     deadline had left at the pause (a Connect or Resume never gives it
//     less than its timeout from now): time paused does not count.
//   - Pausing a paused sandbox and resuming a running one fail with
//     api.ErrConflict and change nothing.
//   - Start marks every sandbox the store still holds as running or paused
//     killed and then calls Backend.Cleanup, so a crashed daemon leaves
//     nothing behind: paused sandboxes do not survive a restart, except on
//     a backend that keeps them on disk (isolation.Adopter, gVisor), where
//     they are adopted, paused, before the Cleanup.
//   - Snapshots, forks, checkpoints, rewinds and filesystem-only pauses
//     rest on the backend's layers (layers.go): a layer is deleted once no
//     snapshot or checkpoint record, live sandbox or layer above it keeps
//     it, and Start deletes every layer no snapshot keeps, so a crash at
//     any point leaves a recorded snapshot or nothing. A rewind and the
//     resume of a filesystem-only pause reboot the sandbox under its ID,
//     keeping its token, deadline, metadata, environment, network and
//     secret bindings; its processes and memory are not kept.
//   - A killed sandbox is gone for the API: Get, Live, Kill and SetTimeout
//     report api.ErrNotFound for it.
//   - Every sandbox's network fence is the network side's
//     (Options.Network, package fences): one netfence.Net per sandbox ID,
//     made with the sandbox's policy and egress proxy before the backend
//     attaches the sandbox's namespace (isolation.Spec.Network, a value
//     the Manager hands the backend, which calls nothing of the Manager),
//     held by the Manager over the sandbox's pauses, resumes and reboots
//     and released once the sandbox is gone and its last namespace
//     detached. Policy updates, the egress proxy, the gateway's
//     configuration and ingress go to the network side, which reaches
//     the Manager's live sandboxes through fences.Core (network.go); a
//     sandbox is deny-all until it is given a policy (a warm pool's, made
//     ahead on fences.Set.Pool, until the create that takes it).
//
// # Concurrency
//
// All methods are safe for concurrent use. Creates run in parallel; only
// their admission (one at a time, so that each counts those before it)
// and their registration take a lock shared by all sandboxes. Pauses
// and resumes of one sandbox are serialised; they and kills of different
// sandboxes run in parallel.
package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"maps"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
)

// State is a sandbox state as the E2B API names it.
type State string

// States.
const (
	StateRunning State = "running"
	StatePaused  State = "paused"
)

// Sandbox is the manager's view of one running sandbox. Values returned by
// the Manager are copies the caller may keep.
type Sandbox struct {
	ID string
	// Team owns the sandbox: the team of the request that created it.
	Team string
	// TemplateID is the template's ID (a built template's, also when the
	// create named it by alias), a snapshot's ID, or a fork's source's.
	TemplateID string
	// Alias is the template's alias (a snapshot's name), "" if none.
	Alias               string
	State               State
	StartedAt           time.Time
	EndAt               time.Time
	Metadata            map[string]string
	CPUs                float64
	MemoryMB            int64
	DiskMB              int64
	EnvdAccessToken     string
	AllowInternetAccess *bool
	Network             *api.NetworkConfig
	// TrafficAccessToken guards the sandbox's ports other than the
	// agent's; set only when Network.AllowPublicTraffic is false.
	TrafficAccessToken string
	// MaskRequestHost is the Host header sent to the sandbox's ports
	// (${PORT} replaced); empty keeps the client's.
	MaskRequestHost string
	// AutoPause pauses the sandbox at its deadline instead of killing it.
	AutoPause bool
	// AutoResume resumes the paused sandbox when traffic arrives for it.
	AutoResume bool
	// AutoPauseNoMemory makes the pause at the deadline a filesystem-only
	// one (E2B's autoPauseMemory false): the resume reboots.
	AutoPauseNoMemory bool
	// AutoCheckpoint checkpoints the filesystem before every command.
	AutoCheckpoint bool
	// IdleTimeout pauses the sandbox (with its memory) once it has been
	// idle that long (package idle); 0 never.
	IdleTimeout time.Duration
	// RunDone is closed when the sandbox's current run ends by a pause
	// (kill and death close the backend's Done): traffic in flight then
	// is cut. Only set on the copies Live returns.
	RunDone <-chan struct{}
	// Incarnation names the backend sandbox running it now: it changes
	// each time its processes are replaced (a rewind, a filesystem-only
	// resume, a restore), so that a connection kept open to the previous
	// one's agent or ports is never reused. Only set on the copies Live
	// returns.
	Incarnation uint64
}

func (s *Sandbox) clone() *Sandbox {
	c := *s
	c.Metadata = maps.Clone(s.Metadata)
	return &c
}

// CreateRequest is the input of Manager.Create. Zero fields take the
// manager's defaults.
type CreateRequest struct {
	TemplateID          string
	Timeout             time.Duration
	Metadata            map[string]string
	EnvVars             map[string]string // handed to the agent, never stored
	CPUs                float64
	MemoryMB            int64
	DiskMB              int64
	AllowInternetAccess *bool
	Network             *api.NetworkConfig
	// Secrets binds stored secrets to placeholder variables (see
	// api.NewSandbox.Secrets).
	Secrets map[string]api.SecretBinding
	// AutoPause pauses the sandbox at its deadline instead of killing it
	// (E2B's lifecycle.onTimeout "pause").
	AutoPause bool
	// AutoResume resumes the paused sandbox when traffic arrives for it,
	// with the create timeout as its new one.
	AutoResume bool
	// AutoPauseNoMemory makes the pause at the deadline filesystem-only.
	AutoPauseNoMemory bool
	// AutoCheckpoint checkpoints the filesystem before every command
	// (fence's extension), so that an agent can rewind a step.
	AutoCheckpoint bool
	// IdleTimeout, if not nil, is the sandbox's idle timeout (fence's
	// lifecycle.idleTimeout; 0: never paused for idleness); nil takes
	// Defaults.IdleTimeout.
	IdleTimeout *time.Duration
	// Volumes are the fence volumes the sandbox mounts (isolation.Bind
	// with Volume set), resolved by internal/volume.
	Volumes []isolation.Bind
}

// BuildMetadataKey is the metadata key of a template build's sandboxes
// (the value is the build's ID). The API's sandbox lists leave them out,
// as E2B's do, unless asked for them; they count for every limit like
// any sandbox. A create request cannot set it.
const BuildMetadataKey = "fence.template-build"

// ListFilter selects sandboxes in Manager.List. Zero fields select all.
type ListFilter struct {
	// States selects by state; empty means every state.
	States []State
	// Metadata selects sandboxes whose metadata holds every pair.
	Metadata map[string]string
	// WithoutMetadataKeys selects sandboxes whose metadata has none of
	// these keys (the API's lists leave out build sandboxes with it).
	WithoutMetadataKeys []string
	// Template selects sandboxes of one template.
	Template string
	// Limit caps the result; 0 means no cap.
	Limit int
	// PageToken continues a listing after the sandbox an api.PageToken
	// was made from.
	PageToken string
	// StartedAfter selects sandboxes started at or after it.
	StartedAfter time.Time
	// Ascending lists oldest first; the default is newest first.
	Ascending bool
}

const tokenSize = 32

func newToken() string {
	var b [tokenSize]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
