package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tbuild"
)

// registerBuildLogStream serves GET
// /templates/{id}/builds/{buildID}/logs/stream?logsOffset=N: a build's
// state and log lines from line N on, as server-sent events, each event
// a tbuild.Info with the lines new since the last (the shape of GET
// …/status). Lines are sent as they are written (the service's Changed),
// and the stream ends after the event that gives a finished build's
// state. An unknown build is 400, as on …/status.
func (h *handler) registerBuildLogStream(mux *http.ServeMux) {
	mux.HandleFunc("GET /templates/{id}/builds/{buildID}/logs/stream", h.buildLogStream)
}

// buildLogStreamEvery bounds the wait for a change the service does not
// announce (a waiting build canceled by a newer one).
const buildLogStreamEvery = 2 * time.Second

func (h *handler) buildLogStream(w http.ResponseWriter, r *http.Request) {
	t, ok := h.templatesOr(w, r)
	if !ok {
		return
	}
	id, build := r.PathValue("id"), r.PathValue("buildID")
	offset, err := intQuery(r, "logsOffset")
	if err == nil {
		_, err = t.Status(id, build, offset, 1, "")
	}
	if errors.Is(err, api.ErrNotFound) {
		err = errorf(api.ErrInvalidArgument, "Build '%s' not found", build)
	}
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	changes, _ := t.(interface{ Changed() <-chan struct{} })
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	tick := time.NewTicker(buildLogStreamEvery)
	defer tick.Stop()
	var last tbuild.Status
	for {
		var changed <-chan struct{}
		if changes != nil {
			changed = changes.Changed() // taken before the read: no line is missed
		}
		info, err := t.Status(id, build, offset, 100, "")
		if err != nil {
			return // deleted meanwhile
		}
		if len(info.LogEntries) > 0 || info.Status != last {
			b, _ := json.Marshal(info)
			rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
			if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil || rc.Flush() != nil {
				return
			}
			offset += len(info.LogEntries)
			last = info.Status
		}
		if len(info.LogEntries) == 100 {
			continue // more lines are there already
		}
		if info.Status == tbuild.StatusReady || info.Status == tbuild.StatusError {
			return
		}
		select {
		case <-changed:
		case <-tick.C:
		case <-r.Context().Done():
			return
		}
	}
}
