package httpapi

import (
	"context"
	"errors"
	"github.com/fencesandbox/fence/internal/capacity"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/volume"
)

const (
	defaultListLimit = 100
	maxListLimit     = 100
)

// capacityReporter is implemented by a Manager that admits creates
// against the host's limits (*sandbox.Manager with Options.Capacity).
type capacityReporter interface {
	Capacity() (capacity.Status, bool)
}

// healthBody is E2B's health answer with the node's capacity left: how
// many more sandboxes the tightest host limit holds, and which it is.
type healthBody struct {
	api.Error
	Capacity *capacity.Status `json:"capacity,omitempty"`
}

func (h *handler) health(w http.ResponseWriter, r *http.Request) {
	body := healthBody{Error: api.Error{Code: http.StatusOK, Message: "Health check successful"}}
	if c, ok := h.m.(capacityReporter); ok {
		if st, ok := c.Capacity(); ok {
			body.Capacity = &st
		}
	}
	writeJSON(w, http.StatusOK, body)
}

func (h *handler) domainPtr() *string {
	if h.domain == "" {
		return nil
	}
	d := h.domain
	return &d
}

func (h *handler) toAPISandbox(s *sandbox.Sandbox) api.Sandbox {
	return api.Sandbox{
		SandboxID:       s.ID,
		TemplateID:      s.TemplateID,
		Alias:           s.Alias,
		ClientID:        api.ClientID,
		EnvdVersion:     api.EnvdVersion,
		EnvdAccessToken: s.EnvdAccessToken,
		Domain:          h.domainPtr(),
		TrafficAccessToken: func() *string {
			if s.TrafficAccessToken == "" {
				return nil
			}
			return &s.TrafficAccessToken
		}(),
	}
}

func toListed(s *sandbox.Sandbox) api.ListedSandbox {
	return api.ListedSandbox{
		SandboxID:   s.ID,
		TemplateID:  s.TemplateID,
		Alias:       s.Alias,
		ClientID:    api.ClientID,
		CPUCount:    s.CPUs,
		MemoryMB:    s.MemoryMB,
		DiskSizeMB:  s.DiskMB,
		EnvdVersion: api.EnvdVersion,
		StartedAt:   s.StartedAt,
		EndAt:       s.EndAt,
		State:       string(s.State),
		Metadata:    s.Metadata,
	}
}

// sandboxID returns the {id} path value, or an error if it cannot name a
// sandbox (so "..", slashes and the like never reach the manager).
func sandboxID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if !api.ValidSandboxID(id) {
		return "", errorf(api.ErrNotFound, "sandbox %q not found", id)
	}
	return id, nil
}

func seconds(n int32) time.Duration { return time.Duration(n) * time.Second }

// maxIdleTimeoutSeconds bounds lifecycle.idleTimeout before it becomes a
// duration (the Manager checks the range it accepts).
const maxIdleTimeoutSeconds = 30 * 24 * 3600

// createRequest is the Manager's request for a create's body, checked:
// an error wraps api.ErrInvalidArgument (or is mcpSecrets') and nothing
// was started. Volume mounts are resolved by the caller.
func createRequest(req *api.NewSandbox) (sandbox.CreateRequest, error) {
	autoPause := req.AutoPause != nil && *req.AutoPause
	noMemory := req.AutoPauseMemory != nil && !*req.AutoPauseMemory
	if noMemory {
		if !autoPause {
			return sandbox.CreateRequest{}, errorf(api.ErrInvalidArgument, "autoPauseMemory can only be set with autoPause")
		}
		if req.AutoResume != nil && req.AutoResume.Enabled {
			return sandbox.CreateRequest{}, errorf(api.ErrInvalidArgument, "autoResume cannot be combined with autoPauseMemory false")
		}
	}
	if _, ok := req.Metadata[sandbox.BuildMetadataKey]; ok {
		return sandbox.CreateRequest{}, errorf(api.ErrInvalidArgument, "metadata key %s is reserved for template builds", sandbox.BuildMetadataKey)
	}
	secrets, err := mcpSecrets(req.MCP, req.Secrets, req.EnvVars)
	if err != nil {
		return sandbox.CreateRequest{}, err
	}
	cr := sandbox.CreateRequest{
		AutoPauseNoMemory:   noMemory,
		AutoCheckpoint:      req.AutoCheckpoint != nil && *req.AutoCheckpoint,
		AutoPause:           autoPause,
		AutoResume:          req.AutoResume != nil && req.AutoResume.Enabled,
		TemplateID:          req.TemplateID,
		Metadata:            req.Metadata,
		EnvVars:             req.EnvVars,
		AllowInternetAccess: req.AllowInternetAccess,
		Network:             req.Network,
		Secrets:             secrets,
	}
	if req.Timeout != nil {
		if *req.Timeout <= 0 {
			return sandbox.CreateRequest{}, errorf(api.ErrInvalidArgument, "timeout must be a positive number of seconds, got %d", *req.Timeout)
		}
		cr.Timeout = seconds(*req.Timeout)
	}
	if l := req.Lifecycle; l != nil && l.IdleTimeout != nil {
		s := *l.IdleTimeout
		if s < 0 || s > maxIdleTimeoutSeconds {
			return sandbox.CreateRequest{}, errorf(api.ErrInvalidArgument, "lifecycle.idleTimeout must be 0 (never) or a number of seconds up to %d, got %d", maxIdleTimeoutSeconds, s)
		}
		d := time.Duration(s) * time.Second
		cr.IdleTimeout = &d
	}
	if req.CPUCount != nil {
		if *req.CPUCount <= 0 {
			return sandbox.CreateRequest{}, errorf(api.ErrInvalidArgument, "cpuCount must be positive")
		}
		cr.CPUs = *req.CPUCount
	}
	if req.MemoryMB != nil {
		if *req.MemoryMB <= 0 {
			return sandbox.CreateRequest{}, errorf(api.ErrInvalidArgument, "memoryMB must be positive")
		}
		cr.MemoryMB = *req.MemoryMB
	}
	if req.DiskMB != nil {
		if *req.DiskMB <= 0 {
			return sandbox.CreateRequest{}, errorf(api.ErrInvalidArgument, "diskSizeMB must be positive")
		}
		cr.DiskMB = *req.DiskMB
	}
	return cr, nil
}

func (h *handler) create(w http.ResponseWriter, r *http.Request) {
	var req api.NewSandbox
	if err := decodeJSON(r, &req, false); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	cr, err := createRequest(&req)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	var mounts *volume.Mounts
	if len(req.VolumeMounts) > 0 {
		if h.volumes == nil {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "Volume mounts are not enabled."))
			return
		}
		if mounts, err = h.volumes.Resolve(r.Context(), teamOf(r), req.VolumeMounts); err != nil {
			writeError(w, r, h.log, err)
			return
		}
		defer mounts.Release()
		cr.Volumes = mounts.Binds
	}
	s, err := h.m.Create(r.Context(), cr)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if mounts != nil {
		if err := mounts.Record(r.Context(), s.ID); err != nil {
			// Unrecorded, its volumes could be deleted under it.
			h.m.Kill(context.WithoutCancel(r.Context()), s.ID)
			writeError(w, r, h.log, err)
			return
		}
	}
	// A client's first command follows its create at once: the proxy's
	// connection to the new agent is made now, beside the answer, and
	// marked in flight before the answer leaves, so that the first
	// command waits for it rather than dialing another.
	end := h.warmups.begin(s.ID)
	writeJSON(w, http.StatusCreated, h.toAPISandbox(s))
	h.warming.Go(func() {
		defer end()
		h.warmAgent(s.ID)
	})
}

func (h *handler) get(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	s, err := h.m.Get(r.Context(), id)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, api.SandboxDetail{
		ListedSandbox:       h.withVolumes(r, []api.ListedSandbox{toListed(s)})[0],
		AllowInternetAccess: s.AllowInternetAccess,
		Domain:              h.domainPtr(),
		EnvdAccessToken:     s.EnvdAccessToken,
		Network:             netconf.Redacted(s.Network),
		Lifecycle:           lifecycle(s),
	})
}

func lifecycle(s *sandbox.Sandbox) *api.Lifecycle {
	l := &api.Lifecycle{OnTimeout: "kill", AutoResume: s.AutoResume, IdleTimeout: int64(s.IdleTimeout / time.Second)}
	if s.AutoPause {
		l.OnTimeout = "pause"
	}
	return l
}

// pause is POST /sandboxes/{id}/pause: 204, 409 if already paused.
func (h *handler) pause(w http.ResponseWriter, r *http.Request) {
	updateSandbox(h, w, r, true, func(ctx context.Context, id string, req *api.PauseRequest) error {
		return h.pauses.Pause(ctx, id, memory(req.Memory))
	})
}

// memory is the sandbox.Memory of a request's memory field: without it
// only when the field is false.
func memory(field *bool) sandbox.Memory {
	if field != nil && !*field {
		return sandbox.WithoutMemory
	}
	return sandbox.WithMemory
}

// resumeDefaultTimeout is the timeout of POST /sandboxes/{id}/resume
// without one (E2B's).
const resumeDefaultTimeout = 15 * time.Second

// resume is E2B's older POST /sandboxes/{id}/resume: 201 with the
// sandbox, 409 if it is running.
func (h *handler) resume(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	var req api.ResumeRequest
	if err := decodeJSON(r, &req, true); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	d := resumeDefaultTimeout
	if req.Timeout != nil {
		d = seconds(*req.Timeout)
	}
	s, err := h.pauses.Resume(r.Context(), id, d, req.AutoPause, memory(req.Memory))
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, h.toAPISandbox(s))
}

func (h *handler) kill(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err == nil {
		err = h.m.Kill(r.Context(), id)
	}
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) setTimeout(w http.ResponseWriter, r *http.Request) {
	updateSandbox(h, w, r, false, func(ctx context.Context, id string, req *api.TimeoutRequest) error {
		return h.m.SetTimeout(ctx, id, seconds(req.Timeout))
	})
}

// updateNetwork is PUT /sandboxes/{id}/network: E2B's runtime
// replacement of the egress configuration (allowOut, denyOut, rules,
// egressProxy, allow_internet_access, and fence's inspect and
// passthrough). An omitted field is cleared.
func (h *handler) updateNetwork(w http.ResponseWriter, r *http.Request) {
	updateSandbox(h, w, r, false, func(ctx context.Context, id string, req *api.NetworkUpdate) error {
		n := &api.NetworkConfig{
			AllowOut: req.AllowOut, DenyOut: req.DenyOut, Rules: req.Rules,
			EgressProxy: req.EgressProxy, Inspect: req.Inspect, Passthrough: req.Passthrough,
		}
		return h.net.UpdateNetwork(ctx, id, req.AllowInternetAccess, n)
	})
}

// connect answers 200 for a running sandbox after extending (never
// shortening) its deadline, and 201 for a paused one after resuming it.
func (h *handler) connect(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	var req api.ConnectRequest
	if err := decodeJSON(r, &req, true); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	d := h.m.Defaults().Timeout
	if req.Timeout != nil {
		d = seconds(*req.Timeout)
	}
	s, resumed, err := h.pauses.Connect(r.Context(), id, d, memory(req.Memory))
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, h.toAPISandbox(s))
}

func (h *handler) refresh(w http.ResponseWriter, r *http.Request) {
	updateSandbox(h, w, r, true, func(ctx context.Context, id string, req *api.RefreshRequest) error {
		d := h.m.Defaults().Timeout
		if req.Duration != nil {
			d = seconds(*req.Duration)
		}
		return h.m.Extend(ctx, id, d)
	})
}

// updateSandbox is the shape of the routes that change one sandbox: the
// ID from the path, the JSON body into a T (an empty body allowed when
// emptyOK), fn, and 204.
func updateSandbox[T any](h *handler, w http.ResponseWriter, r *http.Request, emptyOK bool, fn func(ctx context.Context, id string, req *T) error) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	var req T
	if err := decodeJSON(r, &req, emptyOK); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if err := fn(r.Context(), id, &req); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) metrics(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	var start, end time.Time
	for name, t := range map[string]*time.Time{"start": &start, "end": &end} {
		if v := r.URL.Query().Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "%s must be a unix time in seconds, got %q", name, v))
				return
			}
			*t = time.Unix(n, 0)
		}
	}
	if !start.IsZero() && !end.IsZero() && end.Before(start) {
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "end is before start"))
		return
	}
	out, err := h.sandboxMetrics(r.Context(), id, start, end)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// sandboxMetrics returns the readings of sandbox id between start and end
// (zero: unbounded), oldest first.
func (h *handler) sandboxMetrics(ctx context.Context, id string, start, end time.Time) ([]api.SandboxMetric, error) {
	s, err := h.m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if h.meter == nil {
		return nil, errorf(api.ErrUnimplemented, "this daemon keeps no resource readings")
	}
	samples, err := h.meter.Metrics(ctx, id, start, end)
	if err != nil {
		return nil, err
	}
	out := make([]api.SandboxMetric, 0, len(samples))
	// CPU use is the share of the sandbox's CPUs used since the previous
	// reading (for the first, since the sandbox started).
	prevAt, prevCPU := s.StartedAt, time.Duration(0)
	for _, x := range samples {
		var pct float64
		if wall := x.At.Sub(prevAt); wall > 0 && s.CPUs > 0 {
			pct = 100 * (x.Stats.CPUUsage - prevCPU).Seconds() / (wall.Seconds() * s.CPUs)
			pct = min(max(pct, 0), 100)
		}
		prevAt, prevCPU = x.At, x.Stats.CPUUsage
		out = append(out, api.SandboxMetric{
			Timestamp:      x.At,
			TimestampUnix:  x.At.Unix(),
			CPUCount:       s.CPUs,
			CPUUsedPct:     pct,
			MemUsed:        x.Stats.MemoryBytes,
			MemTotal:       x.Stats.MemoryLimit,
			DiskUsed:       x.Stats.DiskBytes,
			DiskTotal:      x.Stats.DiskLimit,
			EgressBytesOut: x.EgressOut,
			EgressBytesIn:  x.EgressIn,
		})
	}
	return out, nil
}

// maxMetricsSandboxes bounds the sandboxes of one GET /sandboxes/metrics.
const maxMetricsSandboxes = 100

// metricsOfSandboxes serves GET /sandboxes/metrics?sandbox_ids=a,b: the
// latest reading of each sandbox named, keyed by its ID. A sandbox that
// does not exist (or no longer does) is left out, as is one with no
// reading or whose readings cannot be had.
func (h *handler) metricsOfSandboxes(w http.ResponseWriter, r *http.Request) {
	ids, err := parseSandboxIDs(r.URL.Query()["sandbox_ids"])
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	out := make(map[string]api.SandboxMetric, len(ids))
	for _, id := range ids {
		ms, err := h.sandboxMetrics(r.Context(), id, time.Time{}, time.Time{})
		if err != nil {
			// One sandbox's readings (one being killed, say) fail no other's.
			if !errors.Is(err, api.ErrNotFound) {
				h.log.WarnContext(r.Context(), "reading a sandbox's metrics", "sandbox_id", id, "err", err)
			}
			continue
		}
		if len(ms) > 0 {
			out[id] = ms[len(ms)-1]
		}
	}
	writeJSON(w, http.StatusOK, api.SandboxesWithMetrics{Sandboxes: out})
}

// parseSandboxIDs reads the sandbox_ids query parameter (comma-separated;
// repeated parameters are joined): at least one ID and at most
// maxMetricsSandboxes, each valid and named once. An ID may carry E2B's
// "-clientID" suffix, which is dropped.
func parseSandboxIDs(values []string) ([]string, error) {
	if len(values) == 0 {
		return nil, errorf(api.ErrInvalidArgument, "Query argument sandbox_ids is required, but not found")
	}
	parts := strings.Split(strings.Join(values, ","), ",")
	if len(parts) > maxMetricsSandboxes {
		return nil, errorf(api.ErrInvalidArgument, "Too many sandboxes requested, maximum is %d", maxMetricsSandboxes)
	}
	ids := make([]string, 0, len(parts))
	seen := make(map[string]bool, len(parts))
	for _, p := range parts {
		id, _, _ := strings.Cut(strings.TrimSpace(p), "-")
		if !api.ValidSandboxID(id) {
			return nil, errorf(api.ErrInvalidArgument, "Invalid sandbox ID %q", p)
		}
		if seen[id] {
			return nil, errorf(api.ErrInvalidArgument, "sandbox ID %q is named twice", id)
		}
		seen[id] = true
		ids = append(ids, id)
	}
	return ids, nil
}

func (h *handler) listV1(w http.ResponseWriter, r *http.Request) {
	md, err := parseMetadataFilter(r.URL.Query()["metadata"])
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	f := sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning}, Metadata: md}
	if f.WithoutMetadataKeys, err = hideBuilds(r.URL.Query(), md); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	list, err := h.m.List(r.Context(), f)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, h.withVolumes(r, listed(list)))
}

func (h *handler) listV2(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := sandbox.ListFilter{Template: q.Get("template"), PageToken: q.Get("nextToken"), Limit: defaultListLimit}
	var err error
	if f.Metadata, err = parseMetadataFilter(q["metadata"]); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if f.WithoutMetadataKeys, err = hideBuilds(q, f.Metadata); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	for _, v := range q["state"] {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				f.States = append(f.States, sandbox.State(s))
			}
		}
	}
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "startedAfter must be an RFC 3339 time, got %q", v))
			return
		}
		f.StartedAfter = t
	}
	switch o := q.Get("order"); o {
	case "", "desc":
	case "asc":
		f.Ascending = true
	default:
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "order must be asc or desc, got %q", o))
		return
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "limit must be an integer from 1 to %d, got %q", maxListLimit, v))
			return
		}
		f.Limit = n
	}
	limit := f.Limit
	f.Limit++ // one more tells whether there is a next page
	list, err := h.m.List(r.Context(), f)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if len(list) > limit {
		list = list[:limit]
		last := list[len(list)-1]
		w.Header().Set(api.HeaderNextToken, api.PageToken(last.StartedAt, last.ID))
	}
	writeJSON(w, http.StatusOK, h.withVolumes(r, listed(list)))
}

func listed(list []*sandbox.Sandbox) []api.ListedSandbox {
	out := make([]api.ListedSandbox, 0, len(list))
	for _, s := range list {
		out = append(out, toListed(s))
	}
	return out
}

// hideBuilds returns the metadata keys a list leaves out: template build
// sandboxes, unless the query asks for them (includeBuilds=true, fence's
// extension) or its metadata filter names the build key.
func hideBuilds(q url.Values, md map[string]string) ([]string, error) {
	switch v := q.Get("includeBuilds"); v {
	case "", "false":
	case "true":
		return nil, nil
	default:
		return nil, errorf(api.ErrInvalidArgument, "includeBuilds must be true or false, got %q", v)
	}
	if _, ok := md[sandbox.BuildMetadataKey]; ok {
		return nil, nil
	}
	return []string{sandbox.BuildMetadataKey}, nil
}

// parseMetadataFilter decodes the SDKs' metadata filter:
// after the normal query decoding, the value is unescaped once more, split
// into k=v pairs on '&', and each key and value unescaped again.
func parseMetadataFilter(values []string) (map[string]string, error) {
	if len(values) == 0 {
		return nil, nil
	}
	md := map[string]string{}
	for _, raw := range values {
		if raw == "" {
			continue
		}
		whole, err := url.QueryUnescape(raw)
		if err != nil {
			return nil, errorf(api.ErrInvalidArgument, "invalid metadata filter %q", raw)
		}
		for _, pair := range strings.Split(whole, "&") {
			parts := strings.Split(pair, "=")
			if len(parts) != 2 {
				return nil, errorf(api.ErrInvalidArgument, "invalid metadata filter pair %q: want key=value", pair)
			}
			k, err1 := url.QueryUnescape(parts[0])
			v, err2 := url.QueryUnescape(parts[1])
			if err1 != nil || err2 != nil || k == "" {
				return nil, errorf(api.ErrInvalidArgument, "invalid metadata filter pair %q", pair)
			}
			md[k] = v
		}
	}
	return md, nil
}
