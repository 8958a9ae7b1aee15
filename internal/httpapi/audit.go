package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
)

// AuditLog is the part of *audit.Log the API uses.
type AuditLog interface {
	audit.Sink
	Query(ctx context.Context, f audit.Filter) ([]audit.Record, error)
	Subscribe(f audit.Filter, buffer int) *audit.Subscription
}

var _ AuditLog = (*audit.Log)(nil)

const (
	defaultAuditLimit = 1000
	maxAuditLimit     = 10_000
	// streamBuffer is a stream subscriber's room: one that falls this far
	// behind is disconnected (it resumes with Last-Event-ID).
	streamBuffer = 1024
	// streamHeartbeat keeps idle streams (and proxies) alive.
	streamHeartbeat = 15 * time.Second
	// streamWriteTimeout bounds one write to a stream's client.
	streamWriteTimeout = 30 * time.Second
	maxLogSearch       = 256
	defaultLogsLimit   = 1000
	maxLogsLimitV2     = 1000
)

func (h *handler) auditOr(w http.ResponseWriter, r *http.Request) (AuditLog, bool) {
	if h.audit == nil {
		writeError(w, r, h.log, errorf(api.ErrUnimplemented, "this daemon keeps no audit log"))
		return nil, false
	}
	return h.audit, true
}

// auditFilter reads sandbox, since, until (RFC 3339, or for since a
// duration back from now: 1h), type (comma-separated, repeatable), after
// (a seq) and limit.
func (h *handler) auditFilter(r *http.Request) (audit.Filter, error) {
	q := r.URL.Query()
	f := audit.Filter{Sandbox: q.Get("sandbox"), Limit: defaultAuditLimit}
	for _, name := range []string{"since", "until"} {
		v := q.Get(name)
		if v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			d, derr := time.ParseDuration(v)
			if derr != nil || d < 0 {
				return f, errorf(api.ErrInvalidArgument, "%s must be an RFC 3339 time or a duration back from now, got %q", name, v)
			}
			t = h.now().Add(-d)
		}
		if name == "since" {
			f.Since = t
		} else {
			f.Until = t
		}
	}
	for _, v := range q["type"] {
		for t := range strings.SplitSeq(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				f.Types = append(f.Types, t)
			}
		}
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return f, errorf(api.ErrInvalidArgument, "after must be a record seq, got %q", v)
		}
		f.After = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > maxAuditLimit {
			return f, errorf(api.ErrInvalidArgument, "limit must be 1 to %d, got %q", maxAuditLimit, v)
		}
		f.Limit = n
	}
	return f, nil
}

// auditRequest gives the audit log and the filter a GET /audit or
// /audit/stream asks for; it has answered the request when ok is false.
func (h *handler) auditRequest(w http.ResponseWriter, r *http.Request) (al AuditLog, f audit.Filter, ok bool) {
	al, ok = h.auditOr(w, r)
	if !ok {
		return nil, f, false
	}
	f, err := h.auditFilter(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return nil, f, false
	}
	return al, f, true
}

// auditQuery is GET /audit: the matching records, oldest first.
func (h *handler) auditQuery(w http.ResponseWriter, r *http.Request) {
	al, f, ok := h.auditRequest(w, r)
	if !ok {
		return
	}
	f.Match = both(f.Match, h.auditVisible(r.Context()))
	recs, err := al.Query(r.Context(), f)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if recs == nil {
		recs = []audit.Record{}
	}
	writeJSON(w, http.StatusOK, recs)
}

// auditStream is GET /audit/stream: server-sent events, one per matching
// record (id: its seq), first those after Last-Event-ID (or ?after=),
// then live. A client that falls behind is disconnected; it resumes with
// Last-Event-ID.
func (h *handler) auditStream(w http.ResponseWriter, r *http.Request) {
	al, f, ok := h.auditRequest(w, r)
	if !ok {
		return
	}
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "Last-Event-ID must be a record seq, got %q", v))
			return
		}
		f.After = max(f.After, n)
	}
	f.Limit = 0
	sub := al.Subscribe(f, streamBuffer) // the writer matches: no store lookups there
	defer sub.Close()
	s := startEventStream(w, f.After)
	s.visible = h.auditVisible(r.Context())
	f.Match = both(f.Match, s.visible)
	if s.backlog(r.Context(), al, f, sub.From) != nil {
		return
	}
	s.live(r.Context(), sub)
}

// eventStream writes audit records to a client as server-sent events,
// each write bounded by streamWriteTimeout.
type eventStream struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	last uint64 // the seq of the last record sent
	// visible, if set, selects the live records the client may read.
	visible func(*audit.Record) bool
}

// startEventStream answers 200 with an event stream that starts after
// seq after.
func startEventStream(w http.ResponseWriter, after uint64) *eventStream {
	s := &eventStream{w: w, rc: http.NewResponseController(w), last: after}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return s
}

func (s *eventStream) send(rec *audit.Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	s.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	if _, err := fmt.Fprintf(s.w, "id: %d\ndata: %s\n\n", rec.Seq, b); err != nil {
		return err
	}
	s.last = rec.Seq
	return nil
}

func (s *eventStream) flush() error {
	s.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	return s.rc.Flush()
}

// backlog sends the records of f from the files, a page at a time, up to
// from, where the subscription starts; a failed read ends the backlog
// early. Its error is the client's.
func (s *eventStream) backlog(ctx context.Context, al AuditLog, f audit.Filter, from uint64) error {
	for s.last < from {
		page := f
		page.After, page.Limit = s.last, 500
		recs, err := al.Query(ctx, page)
		if err != nil || len(recs) == 0 {
			break
		}
		for i := range recs {
			if err := s.send(&recs[i]); err != nil {
				return err
			}
		}
		if err := s.flush(); err != nil {
			return err
		}
	}
	return s.flush()
}

// live sends sub's records as they come, with a keep-alive comment when
// idle, until the client is gone or the subscription ends (a client too
// slow for it is told so).
func (s *eventStream) live(ctx context.Context, sub *audit.Subscription) {
	beat := time.NewTicker(streamHeartbeat)
	defer beat.Stop()
	for {
		select {
		case rec, ok := <-sub.C:
			if !ok {
				if errors.Is(sub.Err(), audit.ErrSlow) {
					fmt.Fprintf(s.w, "event: error\ndata: %s\n\n", `{"message":"too slow: reconnect with Last-Event-ID"}`)
					s.rc.Flush()
				}
				return
			}
			if rec.Seq <= s.last || (s.visible != nil && !s.visible(&rec)) {
				continue
			}
			if s.send(&rec) != nil || s.sendReady(sub.C) != nil || s.flush() != nil {
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

// keepAlive sends an idle stream's keep-alive comment.
func (s *eventStream) keepAlive() error {
	s.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	if _, err := fmt.Fprint(s.w, ": keep-alive\n\n"); err != nil {
		return err
	}
	return s.flush()
}

// sendReady sends the records already waiting on c, so that one flush
// carries them all.
func (s *eventStream) sendReady(c <-chan audit.Record) error {
	for {
		select {
		case rec, ok := <-c:
			if !ok {
				return nil
			}
			if rec.Seq > s.last {
				if err := s.send(&rec); err != nil {
					return err
				}
			}
		default:
			return nil
		}
	}
}

// knownSandbox reports whether fence knows sandbox id: running, or with
// any audit record.
func (h *handler) knownSandbox(ctx context.Context, al AuditLog, id string) (bool, error) {
	if _, err := h.m.Get(ctx, id); err == nil {
		return true, nil
	}
	recs, err := al.Query(ctx, audit.Filter{Sandbox: id, Limit: 1})
	return len(recs) > 0, err
}

// sandboxLogsCommon validates the sandbox and returns the audit log.
func (h *handler) sandboxLogsCommon(w http.ResponseWriter, r *http.Request) (AuditLog, string, bool) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return nil, "", false
	}
	al, ok := h.auditOr(w, r)
	if !ok {
		return nil, "", false
	}
	known, err := h.knownSandbox(r.Context(), al, id)
	if err != nil {
		writeError(w, r, h.log, err)
		return nil, "", false
	}
	if !known {
		writeError(w, r, h.log, errorf(api.ErrNotFound, "sandbox %q not found", id))
		return nil, "", false
	}
	return al, id, true
}

func logEntry(rec *audit.Record) api.SandboxLogEntry {
	level, msg, fields := audit.Summary(rec)
	return api.SandboxLogEntry{Timestamp: rec.Time, Level: level, Message: msg, Fields: fields}
}

// sandboxLogsV1 is GET /sandboxes/{id}/logs?start=MS&limit=N: the
// sandbox's audit records from start on, oldest first; each as its JSON
// record line (logs) and as an entry (logEntries).
func (h *handler) sandboxLogsV1(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := audit.Filter{Limit: defaultLogsLimit}
	if v := q.Get("start"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "start must be a time in milliseconds since the epoch, got %q", v))
			return
		}
		f.Since = time.UnixMilli(n)
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "limit must be a non-negative number, got %q", v))
			return
		}
		f.Limit = min(n, maxAuditLimit)
	}
	al, id, ok := h.sandboxLogsCommon(w, r)
	if !ok {
		return
	}
	f.Sandbox = id
	out := api.SandboxLogs{Logs: []api.SandboxLog{}, LogEntries: []api.SandboxLogEntry{}}
	if f.Limit > 0 {
		recs, err := al.Query(r.Context(), f)
		if err != nil {
			writeError(w, r, h.log, err)
			return
		}
		for i := range recs {
			line, _ := json.Marshal(&recs[i])
			out.Logs = append(out.Logs, api.SandboxLog{Timestamp: recs[i].Time, Line: string(line)})
			out.LogEntries = append(out.LogEntries, logEntry(&recs[i]))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// sandboxLogsV2 is GET /v2/sandboxes/{id}/logs?cursor=MS&limit=N&
// direction=forward|backward&level=L&search=S: forward, the entries from
// cursor on, oldest first; backward, those up to cursor, newest first.
func (h *handler) sandboxLogsV2(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := audit.Filter{Limit: defaultLogsLimit}
	var cursor *time.Time
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "cursor must be a time in milliseconds since the epoch, got %q", v))
			return
		}
		t := time.UnixMilli(n)
		cursor = &t
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxLogsLimitV2 {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "limit must be 0 to %d, got %q", maxLogsLimitV2, v))
			return
		}
		f.Limit = n
	}
	switch d := q.Get("direction"); d {
	case "", "forward":
		if cursor != nil {
			f.Since = *cursor
		}
	case "backward":
		f.Desc = true
		if cursor != nil {
			f.Until = *cursor
		}
	default:
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "direction must be forward or backward, got %q", d))
		return
	}
	minLevel := 0
	if v := q.Get("level"); v != "" {
		if minLevel = audit.LevelRank(v); minLevel < 0 {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "level must be debug, info, warn or error, got %q", v))
			return
		}
	}
	search := q.Get("search")
	if len(search) > maxLogSearch {
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "search must be at most %d characters", maxLogSearch))
		return
	}
	al, id, ok := h.sandboxLogsCommon(w, r)
	if !ok {
		return
	}
	f.Sandbox = id
	if minLevel > 0 || search != "" {
		f.Match = func(rec *audit.Record) bool {
			level, msg, _ := audit.Summary(rec)
			return audit.LevelRank(level) >= minLevel && strings.Contains(msg, search)
		}
	}
	out := api.SandboxLogsV2{Logs: []api.SandboxLogEntry{}}
	if f.Limit > 0 {
		recs, err := al.Query(r.Context(), f)
		if err != nil {
			writeError(w, r, h.log, err)
			return
		}
		for i := range recs {
			out.Logs = append(out.Logs, logEntry(&recs[i]))
		}
	}
	writeJSON(w, http.StatusOK, out)
}
