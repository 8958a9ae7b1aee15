package isolation

import (
	"context"
	"errors"
	"time"
)

// ErrLayerBudget is returned when a new layer would take the backend past
// the disk budget it keeps for layers, or a sandbox past the deepest stack
// of layers it may boot on.
var ErrLayerBudget = errors.New("layer budget exhausted")

// ErrLayerInUse is returned by DeleteLayer for a layer a live sandbox
// boots on (directly or below another layer).
var ErrLayerInUse = errors.New("layer in use")

// ErrUnsupported is returned for an operation a backend cannot do (for
// example listing the changed files of a gVisor sandbox).
var ErrUnsupported = errors.New("not supported by this backend")

// A layer is an immutable copy of what a sandbox had changed against its
// template (or against the layer it booted on, its parent) at one moment:
// files, directories, symlinks and deletions. Sandboxes boot on a layer
// (and, through it, its parents and the template) with a fresh writable
// layer of their own on top: a layer is shared by every sandbox made from
// it and never copied again.

// Checkpointer is implemented by sandboxes whose filesystem can be frozen
// into a layer while they run.
//
// Checkpoint stops the sandbox's processes for as long as it takes to copy
// its writable layer, copies it into a new layer whose parent is the layer
// the sandbox booted on, and lets the processes run on; they see no change.
// A failed Checkpoint leaves no layer and the sandbox running. Changes
// lists what the sandbox changed against its template, now (hashing every
// changed file by its data, holes left unread: it costs the blocks they
// hold, and a cancelled ctx stops it mid-file). Base is the layer the sandbox
// booted on, "" for the template alone.
type Checkpointer interface {
	Checkpoint(ctx context.Context) (LayerInfo, error)
	Changes(ctx context.Context) ([]FileChange, error)
	Base() string
}

// Layers is implemented by backends that keep layers and boot sandboxes on
// them. A layer lives until DeleteLayer, whatever boots on it later: the
// caller owns the decision (it knows which records and sandboxes use
// which layers) and must not delete a layer that a live sandbox, or a
// layer a live sandbox uses, has as parent.
type Layers interface {
	// CreateOn is Create with layer (and its parents) between the template
	// and the new sandbox's writable layer. Its agent runs with
	// spec.Agent, also when the layer keeps memory (LayerInfo.Memory) and
	// the agent is the source's, restored.
	CreateOn(ctx context.Context, spec Spec, layer string) (Sandbox, error)
	// LayerChanges lists what layer and its parents changed against the
	// template, as Checkpointer.Changes does for a running sandbox.
	LayerChanges(ctx context.Context, layer string) ([]FileChange, error)
	// ListLayers lists the complete layers the backend keeps. Layers
	// whose making a crash interrupted are removed by Backend.Cleanup.
	ListLayers(ctx context.Context) ([]LayerInfo, error)
	// DeleteLayer removes a layer; an unknown one is not an error, one a
	// live sandbox boots on is ErrLayerInUse (a killed sandbox's layers
	// are free once its release is done).
	DeleteLayer(ctx context.Context, id string) error
}

// FileCheckpointer is implemented by Checkpointers whose Checkpoint keeps
// memory and processes too (LayerInfo.Memory): CheckpointFiles makes a
// layer of the filesystem alone, on which sandboxes boot anew (a pause
// without memory), with Checkpoint's other guarantees.
type FileCheckpointer interface {
	CheckpointFiles(ctx context.Context) (LayerInfo, error)
}

// LayerHolder is implemented by sandboxes that keep layers of their own
// besides the one they boot on: a checkpoint stacked on the previous one
// needs that one (whatever the caller's records say of it), and a squash
// of checkpoints in progress the layers it reads and makes. The caller
// keeps them, and their parents, while the sandbox lives.
type LayerHolder interface {
	HeldLayers() []string
}

// LayerOwner is implemented by a Layers backend that can tell its layers
// from another's without listing them all, so that a router of several
// backends (isolation/multi) sends each layer to its own backend.
type LayerOwner interface {
	HasLayer(id string) bool
}

// LayerInfo describes one layer.
type LayerInfo struct {
	ID      string
	Parent  string // "" when the layer sits on the template alone
	Depth   int    // 1 + the parent's depth
	Bytes   int64  // what the layer's own files weigh on the host's disk
	Files   int    // entries in the layer (not its parents)
	Created time.Time
	// Took is how long the sandbox was stopped while its writable layer
	// was copied (set by Checkpoint only).
	Took time.Duration
	// Memory tells that the layer holds the sandbox's memory and processes
	// too (gVisor's checkpoint images): a sandbox booted on it goes on where
	// the source was, instead of starting anew on its files.
	Memory bool
}

// FileChange is one path a layer (with its parents) or a running sandbox
// changed against the template: Kind is "file", "dir", "symlink", "other"
// (a fifo) or "removed" (deleted, or hidden by a directory made anew).
type FileChange struct {
	Path string `json:"path"`
	Kind string `json:"kind"`
	Size int64  `json:"size,omitempty"`
	Mode uint32 `json:"mode,omitempty"`
	// SHA256 is a regular file's hash: the SHA-256 of its bytes, or, for
	// a file with holes, of its hole map and data (docs/LIFECYCLE.md), so
	// that the same bytes with other holes hash differently.
	SHA256 string `json:"sha256,omitempty"`
	Target string `json:"target,omitempty"` // symlinks
	// Opaque marks a directory made anew over one of the template's: what
	// was below it in the template is hidden.
	Opaque bool `json:"opaque,omitempty"`
	// InTemplate tells that the template has something at Path.
	InTemplate bool `json:"inTemplate,omitempty"`
}
