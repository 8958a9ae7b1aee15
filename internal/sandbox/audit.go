package sandbox

import (
	"context"
	"maps"
	"slices"

	"github.com/fencesandbox/fence/internal/audit"
)

// events records the lifecycle events (create, kill and why, pause, …) in
// the audit trail; the Manager embeds it.
type events struct {
	audit audit.Sink // nil: nothing is recorded
}

// record appends a lifecycle event to the audit trail, if there is one.
// The actor is the one ctx carries (the API key's holder), or "daemon".
func (ev events) record(ctx context.Context, typ, id string, data map[string]any) {
	if ev.audit == nil {
		return
	}
	ev.audit.Append(context.WithoutCancel(ctx), audit.Event{Type: typ, SandboxID: id, Actor: audit.ActorFrom(ctx), Data: data})
}

// createRecord is what the audit trail keeps of a create: never the
// values of its variables (they may be secrets), only their names.
func createRecord(req CreateRequest, info *Sandbox) map[string]any {
	d := map[string]any{
		"template": info.TemplateID, "requested_template": req.TemplateID, "cpus": info.CPUs, "memory_mb": info.MemoryMB, "disk_mb": info.DiskMB,
		"end_at": info.EndAt, "env": slices.Sorted(maps.Keys(req.EnvVars)), "metadata": info.Metadata,
	}
	if info.Network != nil {
		d["network"] = info.Network
	}
	if info.AllowInternetAccess != nil {
		d["allow_internet_access"] = *info.AllowInternetAccess
	}
	if len(req.Secrets) > 0 {
		b := map[string]string{}
		for env, s := range req.Secrets {
			b[env] = s.Secret
		}
		d["secret_bindings"] = b
	}
	return d
}
