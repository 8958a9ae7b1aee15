// Package audit is fence's audit trail: one append-only, hash-chained log
// of what the daemon saw itself (API actions, sandbox lifecycle, process
// starts and ends, file writes, egress and gateway decisions, downloads),
// with signed checkpoints so that editing, deleting, reordering or
// truncating records is detected.
//
// # Guarantees
//
//   - Append never waits on the disk: it queues, waiting at most
//     Options.BlockFor (100 ms) for room, then drops; every drop is counted
//     and recorded in the chain (audit.dropped). The queue is bounded in
//     records and in bytes, and a record's fields are capped.
//   - What a sandbox drives (its flows, gateway requests, secret uses and
//     downloads: SandboxDriven) never waits and cannot crowd out the rest:
//     each sandbox has an allowance (refusals apart from the rest), and
//     those records take at most three quarters of the queue. What is
//     left out is counted per type, host, decision and secret in an
//     audit.suppressed record of the sandbox; nothing is lost uncounted.
//   - One writer commits in groups with one write and one fdatasync; a
//     record is visible (Query, Subscribe, Forward) only once on disk. A
//     crash loses at most the queue and the group in flight; a torn final
//     line is cut at the next Open, and that is recorded.
//   - seq rises by one per record; each record holds the SHA-256 of the
//     line before it; checkpoints (every 1000 records, every 5 s, at Close)
//     sign the chain with Ed25519. Verify names the first record edited,
//     deleted, moved or cut; records after the last checkpoint are
//     unsigned, and the key's holder can rewrite everything (docs/AUDIT.md).
//   - Files are 0600 in a 0700 directory; the key is refused when a
//     symlink or readable by others. Readers (Query, Export, Verify) read
//     complete lines only, so they are safe while the daemon writes.
//   - Kept command output and segments have budgets: per stream, per
//     sandbox, Retention (7 days) and MaxBytes, and each removal of a
//     segment is recorded and signed at once by a checkpoint; Verify
//     accepts a prune record only under a later checkpoint and when it
//     agrees with the segment names.
package audit

import (
	"context"
	"time"
)

// Event types. A record's Type is one of these.
const (
	TypeAPI     = "api" // an API request: method, route, status, actor
	TypeCreate  = "sandbox.create"
	TypeKill    = "sandbox.kill" // reason: request, timeout, exited, shutdown
	TypeTimeout = "sandbox.timeout"
	TypePause   = "sandbox.pause"
	TypeResume  = "sandbox.resume"
	// Filesystem layers: checkpoint, rewind, snapshot (and its deletion),
	// fork.
	TypeSandboxCheckpoint = "sandbox.checkpoint"
	TypeRewind            = "sandbox.rewind"
	TypeSnapshot          = "sandbox.snapshot"
	TypeSnapshotDelete    = "snapshot.delete"
	TypeFork              = "sandbox.fork"
	TypeProcStart         = "process.start" // argv, env names (never values), cwd, user, pid
	TypeProcEnd           = "process.end"   // pid, exit code or signal, output size and sha256
	TypeFileWrite         = "file.write"    // path, size, sha256
	TypeFlow              = "egress.flow"   // a network flow decision
	TypeGateway           = "gateway.request"
	TypeDownload          = "gateway.download"
	TypeSecretUse         = "secret.use"
	TypeApproval          = "egress.approval" // a decision on a held lookup: name, decision, request id; Actor decided
)

// Event is one thing the daemon saw. Data holds the type's fields; it is
// stored as JSON and must never hold a secret's value or an environment
// variable's value.
type Event struct {
	Type      string
	Time      time.Time // zero: the time it is appended
	SandboxID string    // "" for events of no sandbox
	// Actor is who caused it: "key:" and a short hash of the API key for
	// API requests, "daemon" for the daemon's own decisions (timeouts).
	Actor string
	Data  map[string]any
}

// Sink takes events. Append must not block its caller for long (a
// request, a network flow): it queues, and the log's writer commits.
type Sink interface {
	Append(ctx context.Context, ev Event)
}

// Discard is a Sink that keeps nothing.
type Discard struct{}

// Append implements Sink.
func (Discard) Append(context.Context, Event) {}
