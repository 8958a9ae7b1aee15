package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tbuild"
)

// Templates is the template build service (*tbuild.Runner).
type Templates interface {
	Register(ctx context.Context, name string, tags []string, cpus, memoryMB int) (*tbuild.Registered, error)
	FileStatus(templateID, hash string) (present bool, token string, err error)
	Upload(ctx context.Context, token string, body io.Reader) error
	Trigger(ctx context.Context, templateID, buildID string, spec tbuild.Spec) error
	Status(templateID, buildID string, offset, limit int, level string) (*tbuild.Info, error)
	Logs(templateID, buildID string, cursor int64, backward bool, limit int, level string) ([]tbuild.LogEntry, error)
	AssignTags(ctx context.Context, target string, tags []string) (string, []string, error)
	RemoveTags(ctx context.Context, name string, tags []string) error
	Tags(idOrName string) ([]tbuild.TagInfo, error)
	Alias(name string) (id string, public bool, err error)
	Delete(ctx context.Context, idOrName string) error
	List() []tbuild.Listed
	Get(id string) (*tbuild.Detail, error)
	SetPublic(ctx context.Context, id string, public *bool) ([]string, error)
	// Owner gives the team of the built template idOrName names.
	Owner(idOrName string) (team string, public, found bool)
}

// uploadPrefix is where the upload links of COPY archives point: no API
// key, the link's token is the credential, good for one PUT
// (tbuild.Service.Upload, which the Runner has).
const uploadPrefix = "/_fence/template-files/"

func (h *handler) templatesOr(w http.ResponseWriter, r *http.Request) (Templates, bool) {
	if h.templates == nil {
		writeError(w, r, h.log, errorf(api.ErrUnimplemented, "template builds are not enabled on this server"))
		return nil, false
	}
	if err := h.ownTemplate(r, templateInPath(r)); err != nil {
		writeError(w, r, h.log, err)
		return nil, false
	}
	return h.templates, true
}

func (h *handler) registerTemplate(w http.ResponseWriter, r *http.Request) {
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	var body struct {
		Name     string   `json:"name"`
		Alias    string   `json:"alias"`
		Tags     []string `json:"tags"`
		CPUCount *int     `json:"cpuCount"`
		MemoryMB *int     `json:"memoryMB"`
	}
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	name := body.Name
	if name == "" {
		name = body.Alias
	}
	cpus, mem := 0, 0
	if body.CPUCount != nil {
		cpus = *body.CPUCount
		if cpus == 0 {
			cpus = -1
		}
	}
	if body.MemoryMB != nil {
		mem = *body.MemoryMB
		if mem == 0 {
			mem = -1
		}
	}
	res, err := t.Register(r.Context(), name, body.Tags, cpus, mem)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusAccepted, res)
}

func (h *handler) templateFiles(w http.ResponseWriter, r *http.Request) {
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	present, token, err := t.FileStatus(r.PathValue("id"), r.PathValue("hash"))
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	writeJSON(w, http.StatusCreated, map[string]any{"present": present, "url": scheme + "://" + r.Host + uploadPrefix + h.uploadTag + token})
}

// serveTemplateUpload takes a COPY archive at an upload link.
func (h *handler) serveTemplateUpload(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut && r.Method != http.MethodPost {
		w.Header().Set("Allow", "PUT")
		writeError(w, r, h.log, errorf(errMethodNotAllowed, "method %s is not allowed on an upload link", r.Method))
		return
	}
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	token, ok := strings.CutPrefix(strings.TrimPrefix(r.URL.Path, uploadPrefix), h.uploadTag)
	if !ok {
		writeError(w, r, h.log, fmt.Errorf("upload link %w", api.ErrNotFound))
		return
	}
	if err := t.Upload(r.Context(), token, r.Body); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (h *handler) triggerBuild(w http.ResponseWriter, r *http.Request) {
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	var spec tbuild.Spec
	if err := decodeJSON(r, &spec, false); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if err := t.Trigger(r.Context(), r.PathValue("id"), r.PathValue("buildID"), spec); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

func intQuery(r *http.Request, key string) (int, error) {
	v := r.URL.Query().Get(key)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, errorf(api.ErrInvalidArgument, "%s must be a non-negative integer", key)
	}
	return n, nil
}

func (h *handler) buildStatus(w http.ResponseWriter, r *http.Request) {
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	offset, err := intQuery(r, "logsOffset")
	if err == nil {
		var limit int
		if limit, err = intQuery(r, "limit"); err == nil {
			var info *tbuild.Info
			info, err = t.Status(r.PathValue("id"), r.PathValue("buildID"), offset, limit, r.URL.Query().Get("level"))
			if err == nil {
				writeJSON(w, http.StatusOK, info)
				return
			}
		}
	}
	if errors.Is(err, api.ErrNotFound) { // E2B answers 400 for an unknown build
		err = errorf(api.ErrInvalidArgument, "Build '%s' not found", r.PathValue("buildID"))
	}
	writeError(w, r, h.log, err)
}

func (h *handler) buildLogs(w http.ResponseWriter, r *http.Request) {
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	var cursor int64
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "cursor must be unix milliseconds"))
			return
		}
		cursor = n
	}
	dir := q.Get("direction")
	if dir != "" && dir != "forward" && dir != "backward" {
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "direction must be forward or backward"))
		return
	}
	limit, err := intQuery(r, "limit")
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	logs, err := t.Logs(r.PathValue("id"), r.PathValue("buildID"), cursor, dir == "backward", limit, q.Get("level"))
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": logs})
}

func (h *handler) assignTags(w http.ResponseWriter, r *http.Request) {
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	var body struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if err := h.ownTemplate(r, body.Target); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	buildID, tags, err := t.AssignTags(r.Context(), body.Target, body.Tags)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"buildID": buildID, "tags": tags})
}

func (h *handler) removeTags(w http.ResponseWriter, r *http.Request) {
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	var body struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if err := h.ownTemplate(r, body.Name); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if err := t.RemoveTags(r.Context(), body.Name, body.Tags); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateSub serves GET /templates/aliases/{alias} and GET
// /templates/{id}/tags, which one pattern must take (the two would
// overlap).
func (h *handler) templateSub(w http.ResponseWriter, r *http.Request) {
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	a, b := r.PathValue("a"), r.PathValue("b")
	switch {
	case a == "aliases":
		id, public, err := t.Alias(b)
		if err != nil {
			writeError(w, r, h.log, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"templateID": id, "public": public})
	case b == "tags":
		tags, err := t.Tags(a)
		if err != nil {
			writeError(w, r, h.log, err)
			return
		}
		writeJSON(w, http.StatusOK, tags)
	default:
		writeError(w, r, h.log, errorf(errNoRoute, "no route for %s %s", r.Method, r.URL.Path))
	}
}

func (h *handler) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if h.deleteSnapshot(w, r) {
		return
	}
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	if err := t.Delete(r.Context(), r.PathValue("id")); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) listTemplates(w http.ResponseWriter, r *http.Request) {
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	all := ownTemplates(r, t.List())
	if !strings.HasPrefix(r.URL.Path, "/v2/") {
		writeJSON(w, http.StatusOK, all)
		return
	}
	limit, err := intQuery(r, "limit")
	if err != nil || limit > 100 {
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "limit must be 1..100"))
		return
	}
	if limit == 0 {
		limit = 100
	}
	start := 0
	if tok := r.URL.Query().Get("nextToken"); tok != "" {
		start = -1
		for i, l := range all {
			if l.TemplateID == tok {
				start = i
			}
		}
		if start < 0 {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "invalid nextToken"))
			return
		}
	}
	end := min(len(all), start+limit)
	if end < len(all) {
		w.Header().Set("X-Next-Token", all[end].TemplateID)
	}
	writeJSON(w, http.StatusOK, all[start:end])
}

func (h *handler) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	d, err := t.Get(r.PathValue("id"))
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

func (h *handler) patchTemplate(w http.ResponseWriter, r *http.Request) {
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	var body struct {
		Public *bool `json:"public"`
	}
	if err := decodeJSON(r, &body, true); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	names, err := t.SetPublic(r.Context(), r.PathValue("id"), body.Public)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/v2/") {
		writeJSON(w, http.StatusOK, map[string]any{"names": names})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintln(w, "null")
}
