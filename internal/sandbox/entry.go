package sandbox

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/sandbox/usage"
)

// entry is one live (running or paused) sandbox.
type entry struct {
	// boxp is the backend sandbox; a reboot (rewind, the resume of a
	// filesystem-only pause) replaces it.
	boxp atomic.Pointer[boxRef]
	// spec is what the backend sandbox was made with (the agent's final
	// environment included), for reboots and forks.
	spec isolation.Spec
	// created is the filesystem at create, against the template, for
	// diffs "since create"; nil until the first checkpoint or diff reads
	// it from the boot layer.
	createdLayer string
	// baseTemplate is the template under its layers.
	baseTemplate string
	// autoCheckpoint checkpoints before every command.
	autoCheckpoint bool
	// checkpointed is set once a checkpoint of it was recorded.
	checkpointed atomic.Bool
	// timeout is the create timeout, the new one of an auto-resume.
	timeout time.Duration
	// team owns the sandbox (set before the entry is shared, never
	// changed): a request of another team finds no such sandbox.
	team string

	// life serialises pause and resume.
	life sync.Mutex

	mu sync.Mutex
	// +checklocks:mu
	info *Sandbox
	// +checklocks:mu
	samples usage.Ring // resource history (usage.go)
	// +checklocks:mu
	net *netconf.Config // the compiled network in force
	// +checklocks:mu
	runDone chan struct{} // closed when the current run ends by a pause
	// +checklocks:mu
	use usage.Acc // what it used (usage.go)
	// +checklocks:mu
	layer string // the layer the current backend sandbox booted on
	// +checklocks:mu
	cold string // the layer of a filesystem-only pause, "" otherwise
	// +checklocks:mu
	coldKept bool // the store keeps what the resume of that pause needs
	// +checklocks:mu
	idlePaused bool // paused for idleness (package idle)
	// +checklocks:mu
	idleLeft time.Duration // the time its deadline was ahead at that pause
}

// boxRef is one backend sandbox of an entry; replaced is closed when
// another takes its place.
type boxRef struct {
	isolation.Sandbox
	replaced chan struct{}
	inc      uint64 // unique to this backend sandbox (Sandbox.Incarnation)
}

// incarnations numbers backend sandboxes as entries take them.
var incarnations atomic.Uint64

// sb returns the current backend sandbox.
func (e *entry) sb() isolation.Sandbox { return e.boxp.Load().Sandbox }

func (e *entry) setBox(b isolation.Sandbox) {
	if old := e.boxp.Swap(&boxRef{b, make(chan struct{}), incarnations.Add(1)}); old != nil {
		close(old.replaced)
	}
}

func (e *entry) snapshot() *Sandbox {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.info.clone()
}

// deadline returns the sandbox's deadline, and false when it is paused
// (and has none).
func (e *entry) deadline() (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.info.EndAt, e.info.State == StateRunning
}

func (e *entry) state() State {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.info.State
}
