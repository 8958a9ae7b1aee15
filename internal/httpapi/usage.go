package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/forensics"
	"github.com/fencesandbox/fence/internal/sandbox/usage"
)

// Usage is the owner of usage accounting and of the sandboxes' resource
// readings (*usage.Meter).
type Usage interface {
	Usage(ctx context.Context, f usage.Filter) (*usage.Report, error)
	Metrics(ctx context.Context, id string, start, end time.Time) ([]usage.Sample, error)
}

// Exporter gathers a sandbox's forensics bundle (*export.Exporter).
type Exporter interface {
	Export(ctx context.Context, id string) (*forensics.Bundle, error)
}

var _ Usage = (*usage.Meter)(nil)

// usage is GET /usage?sandbox=&since=&until=&team=: per-sandbox usage
// rows and totals per API key, of the caller's team (the admin: every
// team's, or team's).
func (h *handler) usage(w http.ResponseWriter, r *http.Request) {
	if h.meter == nil {
		writeError(w, r, h.log, errorf(api.ErrUnimplemented, "this daemon accounts no usage"))
		return
	}
	f, err := h.auditFilter(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if id := f.Sandbox; id != "" && !api.ValidSandboxID(id) {
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "invalid sandbox id %q", id))
		return
	}
	ctx, err := h.usageTeam(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	rep, err := h.meter.Usage(ctx, usage.Filter{Sandbox: f.Sandbox, Since: f.Since, Until: f.Until})
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, h.ownUsage(ctx, rep))
}

// export is GET /sandboxes/{id}/export: the sandbox's forensics tar.gz.
// Every error comes before the first byte; one while streaming aborts
// the response, so a client never takes a cut archive for a whole one.
func (h *handler) export(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if h.exporter == nil {
		writeError(w, r, h.log, errorf(api.ErrUnimplemented, "this daemon cannot export sandboxes"))
		return
	}
	b, err := h.exporter.Export(r.Context(), id)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", `attachment; filename="fence-`+id+`.tar.gz"`)
	w.WriteHeader(http.StatusOK)
	if err := forensics.Write(r.Context(), w, *b); err != nil {
		h.log.WarnContext(r.Context(), "exporting sandbox", "sandbox_id", id, "err", err)
		panic(http.ErrAbortHandler)
	}
	if h.sink != nil {
		h.sink.Append(context.WithoutCancel(r.Context()), audit.Event{Type: "sandbox.export", SandboxID: id, Actor: audit.ActorFrom(r.Context())})
	}
}
