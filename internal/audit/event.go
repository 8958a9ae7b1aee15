// Package audit is fence's audit trail: one append-only, hash-chained log
// of what the daemon saw itself (API actions, sandbox lifecycle, process
// starts and ends, file writes, egress and gateway decisions, downloads),
// with signed checkpoints so that editing, deleting, reordering or
// truncating records is detected.
package audit

import (
	"context"
	"time"
)

// Event types. A record's Type is one of these.
const (
	TypeAPI       = "api" // an API request: method, route, status, actor
	TypeCreate    = "sandbox.create"
	TypeKill      = "sandbox.kill" // reason: request, timeout, exited, shutdown
	TypeTimeout   = "sandbox.timeout"
	TypePause     = "sandbox.pause"
	TypeResume    = "sandbox.resume"
	TypeProcStart = "process.start" // argv, env names (never values), cwd, user, pid
	TypeProcEnd   = "process.end"   // pid, exit code or signal, output size and sha256
	TypeFileWrite = "file.write"    // path, size, sha256
	TypeFlow      = "egress.flow"   // a network flow decision
	TypeGateway   = "gateway.request"
	TypeDownload  = "gateway.download"
	TypeSecretUse = "secret.use"
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
