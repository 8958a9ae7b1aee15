package httpapi

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
)

// AuditVerifier checks the whole audit trail on disk (audit.Verify with
// the daemon's public key).
type AuditVerifier func(ctx context.Context) (audit.Report, error)

// auditVerification is the body of GET /audit/verify.
type auditVerification struct {
	Intact         bool     `json:"intact"`
	Records        uint64   `json:"records"`
	FirstSeq       uint64   `json:"firstSeq"`
	LastSeq        uint64   `json:"lastSeq"`
	Segments       int      `json:"segments"`
	Checkpoints    int      `json:"checkpoints"`
	LastCheckpoint uint64   `json:"lastCheckpoint"`
	Unsigned       uint64   `json:"unsigned"`
	Warnings       []string `json:"warnings"`
	Break          *struct {
		Segment string `json:"segment"`
		Line    int    `json:"line"`
		Seq     uint64 `json:"seq"`
		Reason  string `json:"reason"`
	} `json:"break"`
}

// verifying runs one verification at a time: each reads the whole trail.
var verifying sync.Mutex

func (h *handler) registerAuditVerify(mux *http.ServeMux) {
	mux.Handle("GET /audit/verify", h.adminOnly(http.HandlerFunc(h.auditVerify)))
}

// auditVerify is GET /audit/verify (the daemon's key alone: the trail spans
// every team): what `fence audit verify` reports, the chain intact or its
// first break, and the last signed checkpoint.
func (h *handler) auditVerify(w http.ResponseWriter, r *http.Request) {
	if h.verifyAudit == nil {
		writeError(w, r, h.log, errorf(api.ErrUnimplemented, "this daemon does not verify its audit trail"))
		return
	}
	verifying.Lock()
	rep, err := h.verifyAudit(r.Context())
	verifying.Unlock()
	var brk *audit.Break
	if err != nil && !errors.As(err, &brk) {
		writeError(w, r, h.log, err)
		return
	}
	out := auditVerification{Intact: rep.Break == nil, Records: rep.Records, FirstSeq: rep.FirstSeq, LastSeq: rep.LastSeq,
		Segments: rep.Segments, Checkpoints: rep.Checkpoints, LastCheckpoint: rep.LastCheckpoint, Unsigned: rep.Unsigned,
		Warnings: rep.Warnings}
	if out.Warnings == nil {
		out.Warnings = []string{}
	}
	if b := rep.Break; b != nil {
		out.Break = &struct {
			Segment string `json:"segment"`
			Line    int    `json:"line"`
			Seq     uint64 `json:"seq"`
			Reason  string `json:"reason"`
		}{b.Segment, b.Line, b.Seq, b.Reason}
	}
	writeJSON(w, http.StatusOK, out)
}
