package api

import "time"

// SnapshotRequest is the optional body of POST /sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	Name *string `json:"name,omitempty"`
}

// SnapshotInfo is a snapshot: 201 of POST /sandboxes/{id}/snapshots, the
// entries of GET /snapshots.
type SnapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// ForkRequest is the optional body of POST /sandboxes/{id}/fork.
type ForkRequest struct {
	Count   *int32 `json:"count,omitempty"`   // 1 when absent
	Timeout *int32 `json:"timeout,omitempty"` // seconds; 15 when absent
}

// ForkResult is one entry of the fork's 201: a sandbox or an error.
type ForkResult struct {
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	Error   *Error   `json:"error,omitempty"`
}

// CheckpointRequest is the optional body of POST
// /sandboxes/{id}/checkpoints (fence's extension).
type CheckpointRequest struct {
	Name string `json:"name,omitempty"`
}

// Checkpoint is a checkpoint of a sandbox's filesystem.
type Checkpoint struct {
	CheckpointID string    `json:"checkpointID"`
	SandboxID    string    `json:"sandboxID"`
	Name         string    `json:"name,omitempty"`
	Auto         bool      `json:"auto,omitempty"`
	Files        int       `json:"files"`
	Bytes        int64     `json:"bytes"`
	CreatedAt    time.Time `json:"createdAt"`
	// FrozenMs is how long the sandbox was stopped while it was taken
	// (in the answer to its creation only).
	FrozenMs float64 `json:"frozenMs,omitempty"`
}

// RewindRequest is the body of POST /sandboxes/{id}/rewind.
type RewindRequest struct {
	CheckpointID string `json:"checkpointID"`
}

// FileDiff is one entry of GET /sandboxes/{id}/diff: a path that differs
// between two states of the sandbox.
type FileDiff struct {
	Path      string `json:"path"`
	Change    string `json:"change"` // added, changed, removed
	Kind      string `json:"kind,omitempty"`
	Size      int64  `json:"size,omitempty"`
	Mode      uint32 `json:"mode,omitempty"`
	SHA256    string `json:"sha256,omitempty"`
	Target    string `json:"target,omitempty"`
	OldSize   int64  `json:"oldSize,omitempty"`
	OldSHA256 string `json:"oldSha256,omitempty"`
}
