package sandbox

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
	"github.com/fencesandbox/fence/internal/sandbox/usage"
)

// LayerArchive gives the archived layers of killed sandboxes
// (*forensics.Archive).
type LayerArchive interface {
	// Open returns the layer's uncompressed tar stream, or an error
	// wrapping api.ErrNotFound.
	Open(id string) (io.ReadCloser, error)
}

// auditQuerier is the part of *audit.Log that reads records back.
type auditQuerier interface {
	Query(ctx context.Context, f audit.Filter) ([]audit.Record, error)
}

// maxExportRecords bounds the audit records an export reads.
const maxExportRecords = 200_000

// ExportCap bounds the layer of a running sandbox in an export.
var ExportCap int64 = forensics.DefaultLayerCap

// Export gathers what fence can show of sandbox id, running, paused or
// killed (within the audit trail's and the forensics archive's
// retention): its record, audit records, usage and filesystem changes.
// A sandbox fence has no trace of is an error wrapping api.ErrNotFound;
// a running sandbox's changes over ExportCap, one wrapping
// api.ErrInvalidArgument (before anything is written).
func (m *Manager) Export(ctx context.Context, id string) (*forensics.Bundle, error) {
	if !api.ValidSandboxID(id) {
		return nil, notFound(id)
	}
	q, _ := m.audit.(auditQuerier)
	b := &forensics.Bundle{}
	if q != nil {
		b.Audit = func(ctx context.Context, w io.Writer) error {
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
	if e, err := m.lookup(id); err == nil {
		info := e.snapshot()
		rep, _ := m.usage.Usage(ctx, usage.Filter{Sandbox: id})
		if rep != nil && len(rep.Sandboxes) == 1 {
			b.Usage = rep.Sandboxes[0]
		}
		md := map[string]any{"id": id, "state": info.State, "sandbox": metadataOf(info)}
		if lr, ok := isolation.As[isolation.LayerReader](e.sb()); ok {
			size, err := lr.LayerSize(ctx)
			if err != nil {
				return nil, fmt.Errorf("exporting sandbox %s: %w", id, err)
			}
			if size > ExportCap {
				return nil, fmt.Errorf("exporting sandbox %s: its filesystem changes take %d bytes, over the export cap of %d: %w",
					id, size, ExportCap, api.ErrInvalidArgument)
			}
			b.Layer = func(ctx context.Context, w io.Writer) error { return lr.ExportLayer(ctx, w, ExportCap) }
		} else {
			md["changes"] = "the " + m.backend.Name() + " backend cannot read a sandbox's layer"
		}
		b.Metadata = md
		return b, nil
	}
	// Killed (or never known): what the audit trail and the archive kept.
	md := map[string]any{"state": "killed"}
	known := false
	if q != nil {
		recs, err := q.Query(ctx, audit.Filter{Sandbox: id, Types: []string{audit.TypeCreate, audit.TypeKill, usage.TypeUsage}})
		if err != nil {
			return nil, fmt.Errorf("exporting sandbox %s: %w", id, err)
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
	}
	if m.forensics != nil {
		rc, err := m.forensics.Open(id)
		switch {
		case err == nil:
			rc.Close()
			known = true
			b.Layer = func(ctx context.Context, w io.Writer) error {
				rc, err := m.forensics.Open(id)
				if err != nil {
					return err
				}
				defer rc.Close()
				_, err = io.Copy(w, rc)
				return err
			}
		case errors.Is(err, api.ErrNotFound):
			md["changes"] = "not kept: the sandbox's layer was not archived, or its archive expired or was dropped for the budget"
		default:
			return nil, fmt.Errorf("exporting sandbox %s: %w", id, err)
		}
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

// metadataOf is the record of a live sandbox as an export shows it: never
// its access tokens.
func metadataOf(s *Sandbox) map[string]any {
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
