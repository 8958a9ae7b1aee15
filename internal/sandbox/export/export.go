// Package export gathers what fence can show of one sandbox, running,
// paused or killed, into a forensics bundle: its record, its audit
// records, its usage and its filesystem changes.
//
// Guarantees:
//   - A sandbox's access tokens are never in a bundle.
//   - A live sandbox's layer over Cap is refused before anything is
//     written; a killed one's comes from the forensics archive as kept.
//   - A sandbox fence has no trace of is an error wrapping
//     api.ErrNotFound.
//
// The Exporter reads the lifecycle core only through Live.
package export

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/forensics"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/usage"
)

// Live is what an export reads of the lifecycle core (*sandbox.Manager).
type Live interface {
	// Live returns a copy of live (running or paused) sandbox id's record
	// and its current backend sandbox; an error when it is not live.
	Live(id string) (*sandbox.Sandbox, isolation.Sandbox, error)
}

var _ Live = (*sandbox.Manager)(nil)

// Options configure an Exporter.
type Options struct {
	Live Live // required
	// Usage, if set, gives a live sandbox's usage.
	Usage *usage.Meter
	// Audit, if it can be queried (*audit.Log), gives a sandbox's audit
	// records, and a killed one's record, kill and usage.
	Audit audit.Sink
	// Archive, if set, gives the archived layers of killed sandboxes.
	Archive LayerArchive
	// Backend names the backend, for a bundle that cannot hold a live
	// sandbox's layer.
	Backend string
}

// Exporter gathers sandboxes' bundles.
type Exporter struct {
	live    Live
	usage   *usage.Meter
	audit   audit.Sink
	archive LayerArchive
	backend string
}

// New returns an Exporter with opts.
func New(opts Options) *Exporter {
	return &Exporter{live: opts.Live, usage: opts.Usage, audit: opts.Audit, archive: opts.Archive, backend: opts.Backend}
}

// auditQuerier is the part of *audit.Log that reads records back.
type auditQuerier interface {
	Query(ctx context.Context, f audit.Filter) ([]audit.Record, error)
}

// LayerArchive gives the archived layers of killed sandboxes
// (*forensics.Archive).
type LayerArchive interface {
	// Open returns the layer's uncompressed tar stream, or an error
	// wrapping api.ErrNotFound.
	Open(id string) (io.ReadCloser, error)
}

// maxExportRecords bounds the audit records an export reads.
const maxExportRecords = 200_000

// Cap bounds the layer of a running sandbox in an export.
var Cap int64 = forensics.DefaultLayerCap

// Export gathers what fence can show of sandbox id, running, paused or
// killed (within the audit trail's and the forensics archive's
// retention): its record, audit records, usage and filesystem changes.
// A sandbox fence has no trace of is an error wrapping api.ErrNotFound;
// a running sandbox's changes over Cap, one wrapping
// api.ErrInvalidArgument (before anything is written).
func (x *Exporter) Export(ctx context.Context, id string) (*forensics.Bundle, error) {
	if !api.ValidSandboxID(id) {
		return nil, notFound(id)
	}
	q, _ := x.audit.(auditQuerier)
	b := &forensics.Bundle{}
	if q != nil {
		b.Audit = auditRecords(q, id)
	}
	if info, box, err := x.live.Live(id); err == nil {
		return x.exportLive(ctx, b, id, info, box)
	}
	// Killed (or never known): what the audit trail and the archive kept.
	md := map[string]any{"state": "killed"}
	known := false
	if q != nil {
		var err error
		if known, err = killedRecords(ctx, q, id, md, b); err != nil {
			return nil, fmt.Errorf("exporting sandbox %s: %w", id, err)
		}
	}
	if x.archive != nil {
		archived, err := x.archivedLayer(id, md, b)
		if err != nil {
			return nil, fmt.Errorf("exporting sandbox %s: %w", id, err)
		}
		known = known || archived
	} else {
		md["changes"] = "not kept: fence serve runs with --forensics-retention 0"
	}
	if !known {
		return nil, notFound(id)
	}
	md["id"] = id
	b.Metadata = md
	return b, nil
}

// auditRecords writes sandbox id's audit records, one JSON object a line.
func auditRecords(q auditQuerier, id string) func(ctx context.Context, w io.Writer) error {
	return func(ctx context.Context, w io.Writer) error {
		recs, err := q.Query(ctx, audit.Filter{Sandbox: id, Limit: maxExportRecords})
		if err != nil {
			return err
		}
		enc := json.NewEncoder(w)
		for i := range recs {
			if err := enc.Encode(&recs[i]); err != nil {
				return err
			}
		}
		return nil
	}
}

// exportLive fills in b for live sandbox id (record info, backend sandbox
// box): its usage, its record, and its layer when the backend can read it
// and it is within Cap.
func (x *Exporter) exportLive(ctx context.Context, b *forensics.Bundle, id string, info *sandbox.Sandbox, box isolation.Sandbox) (*forensics.Bundle, error) {
	if x.usage != nil {
		rep, _ := x.usage.Usage(ctx, usage.Filter{Sandbox: id})
		if rep != nil && len(rep.Sandboxes) == 1 {
			b.Usage = rep.Sandboxes[0]
		}
	}
	md := map[string]any{"id": id, "state": info.State, "sandbox": metadataOf(info)}
	if lr, ok := isolation.As[isolation.LayerReader](box); ok {
		size, err := lr.LayerSize(ctx)
		if err != nil {
			return nil, fmt.Errorf("exporting sandbox %s: %w", id, err)
		}
		if size > Cap {
			return nil, fmt.Errorf("exporting sandbox %s: its filesystem changes take %d bytes, over the export cap of %d: %w",
				id, size, Cap, api.ErrInvalidArgument)
		}
		b.Layer = func(ctx context.Context, w io.Writer) error { return lr.ExportLayer(ctx, w, Cap) }
	} else {
		md["changes"] = "the " + x.backend + " backend cannot read a sandbox's layer"
	}
	b.Metadata = md
	return b, nil
}

// killedRecords puts into md and b what the audit trail kept of killed
// sandbox id (its create, kill and usage records), and reports whether it
// kept any.
func killedRecords(ctx context.Context, q auditQuerier, id string, md map[string]any, b *forensics.Bundle) (known bool, err error) {
	recs, err := q.Query(ctx, audit.Filter{Sandbox: id, Types: []string{audit.TypeCreate, audit.TypeKill, usage.TypeUsage}})
	if err != nil {
		return false, err
	}
	for _, r := range recs {
		known = true
		var d map[string]any
		_ = json.Unmarshal(r.Data, &d)
		switch r.Type {
		case audit.TypeCreate:
			md["created_at"], md["created_by"], md["sandbox"] = r.Time, r.Actor, d
		case audit.TypeKill:
			md["killed_at"], md["kill_reason"] = r.Time, d["reason"]
		case usage.TypeUsage:
			b.Usage = d
		}
	}
	return known, nil
}

// archivedLayer gives b the archived layer of killed sandbox id, or says
// in md why there is none, and reports whether there is one.
func (x *Exporter) archivedLayer(id string, md map[string]any, b *forensics.Bundle) (archived bool, err error) {
	rc, err := x.archive.Open(id)
	switch {
	case err == nil:
		rc.Close()
		b.Layer = func(ctx context.Context, w io.Writer) error {
			rc, err := x.archive.Open(id)
			if err != nil {
				return err
			}
			defer rc.Close()
			_, err = io.Copy(w, rc)
			return err
		}
		return true, nil
	case errors.Is(err, api.ErrNotFound):
		md["changes"] = "not kept: the sandbox's layer was not archived, or its archive expired or was dropped for the budget"
		return false, nil
	default:
		return false, err
	}
}

// metadataOf is the record of a live sandbox as an export shows it: never
// its access tokens.
func metadataOf(s *sandbox.Sandbox) map[string]any {
	d := map[string]any{
		"template": s.TemplateID, "started_at": s.StartedAt, "end_at": s.EndAt, "metadata": s.Metadata,
		"cpus": s.CPUs, "memory_mb": s.MemoryMB, "disk_mb": s.DiskMB,
		"auto_pause": s.AutoPause, "auto_resume": s.AutoResume,
	}
	if s.Network != nil {
		d["network"] = s.Network
	}
	if s.AllowInternetAccess != nil {
		d["allow_internet_access"] = *s.AllowInternetAccess
	}
	return d
}

func notFound(id string) error {
	return fmt.Errorf("sandbox %q not found: %w", id, api.ErrNotFound)
}
