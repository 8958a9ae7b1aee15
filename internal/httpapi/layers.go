package httpapi

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/timetravel"
)

// Layers is what the snapshot, fork, checkpoint, rewind and diff routes
// need; *timetravel.Keeper implements it.
type Layers interface {
	CreateSnapshot(ctx context.Context, id, name string) (*timetravel.SnapshotInfo, error)
	ListSnapshots(ctx context.Context, sandboxID, name string) ([]*timetravel.SnapshotInfo, error)
	DeleteSnapshot(ctx context.Context, ref string) error
	IsSnapshot(ctx context.Context, ref string) bool
	HasTemplate(name string) bool
	Fork(ctx context.Context, id string, count int, d time.Duration) ([]timetravel.ForkResult, error)
	CreateCheckpoint(ctx context.Context, id, name string, auto bool) (*timetravel.Checkpoint, error)
	Checkpoints(ctx context.Context, id string) ([]*timetravel.Checkpoint, error)
	Rewind(ctx context.Context, id, ref string) (*sandbox.Sandbox, error)
	Diff(ctx context.Context, id, from, to string) ([]timetravel.FileDiff, error)
	AutoCheckpoint(ctx context.Context, id string)
}

var _ Layers = (*timetravel.Keeper)(nil)

// layersOr returns Options.Layers, or a 501.
func (h *handler) layersOr() (Layers, error) {
	if h.layers == nil {
		return nil, errorf(api.ErrUnimplemented, "snapshots, forks and checkpoints are not supported by this daemon")
	}
	return h.layers, nil
}

// layersOf opens a handler on one sandbox's layers: Options.Layers
// (or a 501), the sandbox ID from the path and, where req is not nil, the
// request body decoded into req (an empty one allowed as decodeJSON's
// allowEmpty says).
func (h *handler) layersOf(r *http.Request, req any, allowEmpty bool) (Layers, string, error) {
	l, err := h.layersOr()
	if err != nil {
		return nil, "", err
	}
	id, err := sandboxID(r)
	if err != nil {
		return nil, "", err
	}
	if req != nil {
		if err := decodeJSON(r, req, allowEmpty); err != nil {
			return nil, "", err
		}
	}
	return l, id, nil
}

// forkDefaultTimeout is E2B's server default for a fork's timeout.
const forkDefaultTimeout = 15 * time.Second

// createSnapshot is POST /sandboxes/{id}/snapshots: 201 SnapshotInfo.
func (h *handler) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req api.SnapshotRequest
	l, id, err := h.layersOf(r, &req, true)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	name := ""
	if req.Name != nil {
		name = *req.Name
	}
	sn, err := l.CreateSnapshot(r.Context(), id, name)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, api.SnapshotInfo{SnapshotID: sn.SnapshotID, Names: sn.Names})
}

// listSnapshots is GET /snapshots?sandboxID&name&limit&nextToken.
func (h *handler) listSnapshots(w http.ResponseWriter, r *http.Request) {
	l, err := h.layersOr()
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	q := r.URL.Query()
	limit := maxListLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "limit %q: want a positive number", s))
			return
		}
		limit = min(n, maxListLimit)
	}
	offset := 0
	if s := q.Get("nextToken"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "invalid nextToken"))
			return
		}
		offset = n
	}
	list, err := l.ListSnapshots(r.Context(), q.Get("sandboxID"), q.Get("name"))
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	out := []api.SnapshotInfo{}
	for i := offset; i < len(list) && len(out) < limit; i++ {
		out = append(out, api.SnapshotInfo{SnapshotID: list[i].SnapshotID, Names: list[i].Names})
	}
	if offset+len(out) < len(list) {
		w.Header().Set(api.HeaderNextToken, strconv.Itoa(offset+len(out)))
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteTemplate is DELETE /templates/{id}: a snapshot's (E2B's
// deleteSnapshot) is deleted; ordinary templates cannot be deleted here.
// deleteSnapshot deletes ref if it names a snapshot and reports whether
// it did (or answered an error); anything else is a template for
// deleteTemplate.
func (h *handler) deleteSnapshot(w http.ResponseWriter, r *http.Request) bool {
	ref, err := url.PathUnescape(r.PathValue("id"))
	if err != nil {
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "template id: %v", err))
		return true
	}
	l, err := h.layersOr()
	if err != nil || l.HasTemplate(ref) || !l.IsSnapshot(r.Context(), ref) {
		return false
	}
	if err := l.DeleteSnapshot(r.Context(), ref); err != nil {
		writeError(w, r, h.log, err)
		return true
	}
	w.WriteHeader(http.StatusNoContent)
	return true
}

// fork is POST /sandboxes/{id}/fork: 201 with one entry per fork.
func (h *handler) fork(w http.ResponseWriter, r *http.Request) {
	var req api.ForkRequest
	l, id, err := h.layersOf(r, &req, true)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	count, d := 1, forkDefaultTimeout
	if req.Count != nil {
		count = int(*req.Count)
	}
	if req.Timeout != nil {
		if *req.Timeout <= 0 {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "timeout must be a positive number of seconds"))
			return
		}
		d = seconds(*req.Timeout)
	}
	res, err := l.Fork(r.Context(), id, count, d)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	h.inheritVolumes(r, id, res)
	out := make([]api.ForkResult, 0, len(res))
	for _, f := range res {
		if f.Err != nil {
			st := statusOf(f.Err)
			out = append(out, api.ForkResult{Error: &api.Error{Code: st, Message: clientMessage(f.Err, st)}})
			continue
		}
		s := h.toAPISandbox(f.Sandbox)
		out = append(out, api.ForkResult{Sandbox: &s})
	}
	writeJSON(w, http.StatusCreated, out)
}

func toAPICheckpoint(c *timetravel.Checkpoint) api.Checkpoint {
	return api.Checkpoint{CheckpointID: c.ID, SandboxID: c.SandboxID, Name: c.Name, Auto: c.Auto, Files: c.Files,
		Bytes: c.Bytes, CreatedAt: c.CreatedAt, FrozenMs: float64(c.Frozen.Microseconds()) / 1000}
}

// createCheckpoint is POST /sandboxes/{id}/checkpoints: 201 Checkpoint.
func (h *handler) createCheckpoint(w http.ResponseWriter, r *http.Request) {
	var req api.CheckpointRequest
	l, id, err := h.layersOf(r, &req, true)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	c, err := l.CreateCheckpoint(r.Context(), id, req.Name, false)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, toAPICheckpoint(c))
}

// listCheckpoints is GET /sandboxes/{id}/checkpoints, oldest first.
func (h *handler) listCheckpoints(w http.ResponseWriter, r *http.Request) {
	l, id, err := h.layersOf(r, nil, false)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	cs, err := l.Checkpoints(r.Context(), id)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	out := make([]api.Checkpoint, 0, len(cs))
	for _, c := range cs {
		out = append(out, toAPICheckpoint(c))
	}
	writeJSON(w, http.StatusOK, out)
}

// rewind is POST /sandboxes/{id}/rewind: 200 with the sandbox.
func (h *handler) rewind(w http.ResponseWriter, r *http.Request) {
	var req api.RewindRequest
	l, id, err := h.layersOf(r, &req, false)
	if err == nil && req.CheckpointID == "" {
		err = errorf(api.ErrInvalidArgument, "checkpointID is required")
	}
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	s, err := l.Rewind(r.Context(), id, req.CheckpointID)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, h.toAPISandbox(s))
}

// diff is GET /sandboxes/{id}/diff?from&to.
func (h *handler) diff(w http.ResponseWriter, r *http.Request) {
	l, id, err := h.layersOf(r, nil, false)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	q := r.URL.Query()
	d, err := l.Diff(r.Context(), id, q.Get("from"), q.Get("to"))
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	out := make([]api.FileDiff, 0, len(d))
	for _, x := range d {
		out = append(out, api.FileDiff(x))
	}
	writeJSON(w, http.StatusOK, out)
}
