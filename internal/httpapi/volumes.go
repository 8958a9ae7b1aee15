package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/sandbox/timetravel"
	"github.com/fencesandbox/fence/internal/volume"
)

// volumeContentPrefix is the volume content API's: it authenticates with
// the volume's own token (Authorization: Bearer), not with an API key,
// and its bodies are files (no control-plane body limit).
const volumeContentPrefix = "/volumecontent/"

// registerVolumes adds the volume routes (E2B's shapes) to mux.
func (h *handler) registerVolumes(mux *http.ServeMux) {
	mux.HandleFunc("POST /volumes", h.createVolume)
	mux.HandleFunc("GET /volumes", h.listVolumes)
	mux.HandleFunc("GET /volumes/{volumeID}", h.getVolume)
	mux.HandleFunc("DELETE /volumes/{volumeID}", h.deleteVolume)
}

func (h *handler) volumesOr(w http.ResponseWriter, r *http.Request) (*volume.Service, bool) {
	if h.volumes == nil {
		writeError(w, r, h.log, errorf(api.ErrPermissionDenied, "use of volumes is not enabled"))
		return nil, false
	}
	return h.volumes, true
}

// createVolume is POST /volumes.
func (h *handler) createVolume(w http.ResponseWriter, r *http.Request) {
	vs, ok := h.volumesOr(w, r)
	if !ok {
		return
	}
	var req api.NewVolume
	if err := decodeJSON(r, &req, false); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if req.SizeMB < 0 || req.SizeMB > volume.MaxSize>>20 {
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "sizeMB must be from 4 to %d", volume.MaxSize>>20))
		return
	}
	v, err := vs.Create(r.Context(), teamOf(r), req.Name, req.SizeMB<<20)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, volumeOut(v))
}

// listVolumes is GET /volumes: the team's volumes.
func (h *handler) listVolumes(w http.ResponseWriter, r *http.Request) {
	vs, ok := h.volumesOr(w, r)
	if !ok {
		return
	}
	list, err := vs.List(r.Context(), teamOf(r))
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	out := make([]api.Volume, len(list))
	for i, v := range list {
		out[i] = api.Volume{VolumeID: v.ID, Name: v.Name}
	}
	writeJSON(w, http.StatusOK, out)
}

// getVolume is GET /volumes/{volumeID}: the volume with a new token.
func (h *handler) getVolume(w http.ResponseWriter, r *http.Request) {
	vs, ok := h.volumesOr(w, r)
	if !ok {
		return
	}
	v, err := vs.Get(r.Context(), teamOf(r), r.PathValue("volumeID"))
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, volumeOut(v))
}

// deleteVolume is DELETE /volumes/{volumeID}.
func (h *handler) deleteVolume(w http.ResponseWriter, r *http.Request) {
	vs, ok := h.volumesOr(w, r)
	if !ok {
		return
	}
	if err := vs.Delete(r.Context(), teamOf(r), r.PathValue("volumeID")); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func volumeOut(v *volume.Info) api.VolumeAndToken {
	return api.VolumeAndToken{VolumeID: v.ID, Name: v.Name, Token: v.Token, SizeMB: v.SizeBytes >> 20}
}

// serveVolumeContent serves /volumecontent/{volumeID}/{path,dir,file}
// for the bearer of the volume's token.
func (h *handler) serveVolumeContent(w http.ResponseWriter, r *http.Request) {
	if h.volumes == nil {
		writeError(w, r, h.log, errorf(api.ErrPermissionDenied, "use of volumes is not enabled"))
		return
	}
	id, kind, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, volumeContentPrefix), "/")
	if !ok || (kind != "path" && kind != "dir" && kind != "file") {
		writeError(w, r, h.log, errorf(errNoRoute, "no route for %s %s", r.Method, r.URL.Path))
		return
	}
	route := r.Method + " " + kind
	switch route {
	case "GET path", "PATCH path", "DELETE path", "GET dir", "POST dir", "GET file", "PUT file":
	default:
		writeError(w, r, h.log, errorf(errMethodNotAllowed, "method %s is not allowed on %s", r.Method, r.URL.Path))
		return
	}
	token, hasBearer := cutPrefixFold(r.Header.Get("Authorization"), "Bearer ")
	if !hasBearer {
		writeError(w, r, h.log, errorf(errUnauthenticated, "missing volume token: send it as Authorization: Bearer"))
		return
	}
	v, err := h.volumes.Authorize(r.Context(), strings.TrimSpace(token), id)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if h.sink != nil && r.Method != http.MethodGet {
		// Every change through the content API is on the audit trail,
		// under the volume's team.
		tw := &tapWriter{ResponseWriter: w}
		w = tw
		defer func() {
			h.sink.Append(context.WithoutCancel(r.Context()), audit.Event{Type: audit.TypeAPI,
				Actor: "team:" + v.Team + " volume:" + v.ID, Data: map[string]any{"method": r.Method, "route": route,
					"path": r.URL.Path, "file": r.URL.Query().Get("path"), "status": tw.status}})
		}()
	}
	c, err := h.volumes.Open(v)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	defer c.Close()
	h.volumeOp(w, r, c, route)
}

// volumeOp serves route ("METHOD kind") on the volume's content c.
func (h *handler) volumeOp(w http.ResponseWriter, r *http.Request, c *volume.Content, route string) {
	q := r.URL.Query()
	p := q.Get("path")
	var err error
	var st *api.VolumeEntryStat
	status := http.StatusOK
	switch route {
	case "GET path":
		st, err = c.Stat(p)
	case "PATCH path":
		r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
		var m api.VolumeMetadata
		if err = decodeJSON(r, &m, true); err == nil {
			st, err = c.SetMetadata(p, m)
		}
	case "DELETE path":
		if err = c.Remove(r.Context(), p); err == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
	case "GET dir":
		depth := 1
		if d := q.Get("depth"); d != "" {
			if depth, err = strconv.Atoi(d); err != nil {
				err = errorf(api.ErrInvalidArgument, "depth must be a number, got %q", d)
			}
		}
		if err == nil {
			var list []api.VolumeEntryStat
			if list, err = c.List(r.Context(), p, depth); err == nil {
				writeJSON(w, http.StatusOK, list)
				return
			}
		}
	case "POST dir":
		var o volume.FileOptions
		if o, err = volume.ParseFileOptions(q.Get); err == nil {
			st, err = c.MakeDir(p, o)
			status = http.StatusCreated
		}
	case "GET file":
		h.readVolumeFile(w, r, c, p)
		return
	case "PUT file":
		var o volume.FileOptions
		if o, err = volume.ParseFileOptions(q.Get); err == nil {
			st, err = c.Write(p, r.Body, o)
			status = http.StatusCreated
		}
	}
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, status, st)
}

func (h *handler) readVolumeFile(w http.ResponseWriter, r *http.Request, c *volume.Content, p string) {
	f, size, err := c.Read(p)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.CopyN(w, f, size); err != nil && !errors.Is(err, io.EOF) {
		h.log.DebugContext(r.Context(), "reading a volume file", "err", err)
	}
}

// withVolumes fills in the volumes each sandbox of list mounts.
func (h *handler) withVolumes(r *http.Request, list []api.ListedSandbox) []api.ListedSandbox {
	if h.volumes == nil || len(list) == 0 {
		return list
	}
	ids := make([]string, len(list))
	for i, s := range list {
		ids[i] = s.SandboxID
	}
	ms, err := h.volumes.MountsOf(r.Context(), ids...)
	if err != nil {
		h.log.WarnContext(r.Context(), "reading sandboxes' volume mounts", "err", err)
		return list
	}
	for i := range list {
		list[i].VolumeMounts = ms[list[i].SandboxID]
	}
	return list
}

// inheritVolumes records that the forks of parent in res mount its
// volumes. A fork whose record fails is killed and its result is the
// error: unrecorded, its volumes could be deleted under it.
func (h *handler) inheritVolumes(r *http.Request, parent string, res []timetravel.ForkResult) {
	if h.volumes == nil {
		return
	}
	for i, f := range res {
		if f.Err != nil {
			continue
		}
		if err := h.volumes.Inherit(r.Context(), parent, f.Sandbox.ID); err != nil {
			h.m.Kill(context.WithoutCancel(r.Context()), f.Sandbox.ID)
			res[i] = timetravel.ForkResult{Err: err}
		}
	}
}
