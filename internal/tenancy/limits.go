package tenancy

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/fencesandbox/fence/api"
)

// Limits are a team's quotas. A zero field means no limit of that kind;
// a negative one is invalid (Validate).
type Limits struct {
	// ConcurrentSandboxes caps the team's running sandboxes. Paused ones
	// are not counted here (as E2B counts them) but in PausedSandboxes:
	// a resume is a start and is refused at this limit as a create is.
	ConcurrentSandboxes int `json:"concurrentSandboxes"`
	// PausedSandboxes caps the team's paused sandboxes.
	PausedSandboxes int `json:"pausedSandboxes"`
	// VCPUs caps the vCPUs of the team's running sandboxes together.
	VCPUs float64 `json:"vcpus"`
	// MemoryMB caps the memory (MiB) of the team's running sandboxes
	// together.
	MemoryMB int64 `json:"memoryMB"`
	// DiskMB caps the writable disk (MiB) of each sandbox.
	DiskMB int64 `json:"diskMB"`
	// ConcurrentBuilds caps the team's template builds in progress.
	ConcurrentBuilds int `json:"concurrentBuilds"`
	// MaxLifetimeSeconds caps a sandbox's timeout: at its create, and
	// each time it is set, extended or given to a resume.
	MaxLifetimeSeconds int64 `json:"maxLifetimeSeconds"`
	// RequestsPerSecond is the steady rate of control-plane requests each
	// of the team's keys may make; Burst how many it may make at once.
	RequestsPerSecond float64 `json:"requestsPerSecond"`
	Burst             int     `json:"burst"`
	// Snapshots caps the team's persistent snapshots; SnapshotBytes the
	// bytes of their layers together (what each snapshot's layer holds
	// of its own, measured when it is taken).
	Snapshots     int   `json:"snapshots"`
	SnapshotBytes int64 `json:"snapshotBytes"`
	// Secrets caps the team's secrets.
	Secrets int `json:"secrets"`
	// EgressBytesPerDay caps the bytes the team's sandboxes send and
	// receive through the egress fence in one UTC day.
	EgressBytesPerDay int64 `json:"egressBytesPerDay"`
}

// Validate reports a negative field as an error wrapping
// api.ErrInvalidArgument.
func (l Limits) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"concurrentSandboxes", float64(l.ConcurrentSandboxes)},
		{"pausedSandboxes", float64(l.PausedSandboxes)},
		{"vcpus", l.VCPUs},
		{"memoryMB", float64(l.MemoryMB)},
		{"diskMB", float64(l.DiskMB)},
		{"maxLifetimeSeconds", float64(l.MaxLifetimeSeconds)},
		{"concurrentBuilds", float64(l.ConcurrentBuilds)},
		{"requestsPerSecond", l.RequestsPerSecond},
		{"burst", float64(l.Burst)},
		{"snapshots", float64(l.Snapshots)},
		{"snapshotBytes", float64(l.SnapshotBytes)},
		{"secrets", float64(l.Secrets)},
		{"egressBytesPerDay", float64(l.EgressBytesPerDay)},
	} {
		if f.v < 0 || f.v != f.v {
			return fmt.Errorf("limit %s must be 0 (no limit) or more, got %v: %w", f.name, f.v, api.ErrInvalidArgument)
		}
	}
	return nil
}

// Patch returns l with the fields that patch (a JSON object of Limits'
// fields) names set, refusing unknown fields and values Validate
// refuses. l is not changed.
func (l Limits) Patch(patch []byte) (Limits, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(patch, &raw); err != nil {
		return l, fmt.Errorf("limits: malformed JSON object: %v: %w", err, api.ErrInvalidArgument)
	}
	known := map[string]bool{}
	b, _ := json.Marshal(Limits{})
	var zero map[string]any
	_ = json.Unmarshal(b, &zero)
	for k := range zero {
		known[k] = true
	}
	for k := range raw {
		if !known[k] {
			return l, fmt.Errorf("limits: unknown field %q: %w", k, api.ErrInvalidArgument)
		}
	}
	out := l
	if err := json.Unmarshal(patch, &out); err != nil {
		return l, fmt.Errorf("limits: %v: %w", err, api.ErrInvalidArgument)
	}
	if err := out.Validate(); err != nil {
		return l, err
	}
	return out, nil
}

// MaxLifetime is MaxLifetimeSeconds as a duration (0: none).
func (l Limits) MaxLifetime() time.Duration {
	return time.Duration(l.MaxLifetimeSeconds) * time.Second
}
