package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/approvals"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Approvals is the queue of egress approval requests the approval routes
// serve; *approvals.Queue implements it.
type Approvals interface {
	List(visible func(approvals.Request) bool) []approvals.Request
	Decide(ctx context.Context, id string, d approvals.Decision, actor string, visible func(approvals.Request) bool) (approvals.Request, error)
	Subscribe(ctx context.Context) <-chan approvals.Event
}

var _ Approvals = (*approvals.Queue)(nil)

func (h *handler) approvalQueue(w http.ResponseWriter, r *http.Request) (Approvals, bool) {
	if h.approvals == nil {
		writeError(w, r, h.log, errorf(api.ErrUnimplemented, "egress approvals are not enabled"))
		return nil, false
	}
	return h.approvals, true
}

// listApprovals answers GET /approvals: the pending requests, oldest
// first.
func (h *handler) listApprovals(w http.ResponseWriter, r *http.Request) {
	q, ok := h.approvalQueue(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, q.List(h.approvalVisible(r)))
}

// approvalVisible is which requests the caller sees and decides: those of
// its team's sandboxes (another team's answer as missing ones). Without
// sandboxes to own them (a handler of records alone) only the bootstrap
// principal sees any.
func (h *handler) approvalVisible(r *http.Request) func(approvals.Request) bool {
	ctx := r.Context()
	if h.m == nil {
		p, ok := tenancy.FromContext(ctx)
		admin := ok && p.Admin && p.Team == tenancy.DefaultTeamID
		return func(approvals.Request) bool { return admin }
	}
	return func(req approvals.Request) bool { return h.m.Owned(ctx, req.SandboxID) == nil }
}

// decideApproval answers POST /approvals/{id}: the decision applies to
// the held lookup and is recorded with the request's audit actor.
func (h *handler) decideApproval(w http.ResponseWriter, r *http.Request) {
	q, ok := h.approvalQueue(w, r)
	if !ok {
		return
	}
	var body api.ApprovalDecision
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	d, err := approvals.ParseDecision(body.Decision)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	req, err := q.Decide(r.Context(), r.PathValue("id"), d, audit.ActorFrom(r.Context()), h.approvalVisible(r))
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, req)
}

// approvalStream answers GET /approvals/stream: the pending requests,
// then every new and decided one, as server-sent events ("pending" and
// "decided") until the client leaves. A client that does not keep up
// loses events; GET /approvals is the truth.
func (h *handler) approvalStream(w http.ResponseWriter, r *http.Request) {
	q, ok := h.approvalQueue(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	evs := q.Subscribe(ctx)
	visible := h.approvalVisible(r)
	s := startEventStream(w, 0)
	send := func(ev approvals.Event) error {
		b, err := json.Marshal(ev.Request)
		if err != nil {
			return err
		}
		s.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", ev.Type, b); err != nil {
			return err
		}
		return s.flush()
	}
	for _, req := range q.List(visible) {
		if send(approvals.Event{Type: "pending", Request: req}) != nil {
			return
		}
	}
	if s.flush() != nil {
		return
	}
	beat := time.NewTicker(streamHeartbeat)
	defer beat.Stop()
	for {
		select {
		case ev, ok := <-evs:
			if !ok {
				return
			}
			if !visible(ev.Request) {
				continue
			}
			if send(ev) != nil {
				return
			}
		case <-beat.C:
			if s.keepAlive() != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}
