// Package httpapi serves fence's E2B-compatible HTTP API on one handler:
// the REST control plane (/sandboxes, /v2/sandboxes, …) and the traffic
// for sandboxes, which it reverse-proxies to each sandbox's agent.
//
// # Routing
//
// A request is sandbox traffic when it carries the E2b-Sandbox-Id header
// (with E2b-Sandbox-Port), or when its Host is {port}-{id}.{Domain} or
// {port}-{id}.localhost. Everything else is the control plane, whose routes
// are the one table in routes.go.
//
// # Guarantees
//
//   - Control-plane routes other than GET /health require a credential:
//     the bootstrap key (compared in constant time), or a team's API key
//     or access token (looked up by hash on every request, so a revoked
//     one is refused on its next request, and the requests it has in
//     flight, open streams included, end). The request's context carries
//     its tenancy.Principal; the audit trail names it as
//     "team:<id> key:<key id>", never the key.
//   - Every error body is api.Error {"code":N,"message":"…"}; the mapping
//     from the api.Err* taxonomy to status codes is errors.go's alone.
//   - Sandbox traffic reaches the agent only with the sandbox's access
//     token (or, for /files, a valid URL signature). No fence credential
//     enters a sandbox: the API key, access token, traffic token, routing
//     headers and a Bearer API key are removed before forwarding (to the
//     agent and to other ports alike), the agent gets of Authorization only
//     the Basic user name envd reads (another scheme is refused), and a
//     signed URL loses its signature. The agent's internal routes (/init,
//     …) are refused.
//   - Traffic for an unknown, killed or paused sandbox gets 502
//     api.ProxyError (a paused sandbox created with autoResume is resumed
//     instead, and the request served), and responses in flight when a
//     sandbox dies or is paused are aborted, not ended cleanly, so the SDKs
//     report the sandbox as gone.
package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
	"github.com/fencesandbox/fence/internal/sandbox/idle"
	"github.com/fencesandbox/fence/internal/tenancy"
	"github.com/fencesandbox/fence/internal/volume"
)

// Manager is the part of *sandbox.Manager the API uses.
type Manager interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (*sandbox.Sandbox, error)
	Get(ctx context.Context, id string) (*sandbox.Sandbox, error)
	List(ctx context.Context, f sandbox.ListFilter) ([]*sandbox.Sandbox, error)
	SetTimeout(ctx context.Context, id string, d time.Duration) error
	Extend(ctx context.Context, id string, d time.Duration) error
	Kill(ctx context.Context, id string) error
	Live(id string) (*sandbox.Sandbox, isolation.Sandbox, error)
	MatchToken(match func(token string) bool) (id string, ok bool)
	Defaults() sandbox.Defaults
	// Owned checks that the request's team may see sandbox id (live or
	// killed); another team's answers as a missing one.
	Owned(ctx context.Context, id string) error
}

var _ Manager = (*sandbox.Manager)(nil)

// Pauser is the part of *sandbox.Pauses (Manager.Pauses) the API uses:
// the pause, resume and connect routes, and the proxy's resume of a
// paused sandbox created with autoResume.
type Pauser interface {
	Pause(ctx context.Context, id string, mem sandbox.Memory) error
	Resume(ctx context.Context, id string, d time.Duration, autoPause *bool, mem sandbox.Memory) (*sandbox.Sandbox, error)
	Connect(ctx context.Context, id string, d time.Duration, mem sandbox.Memory) (s *sandbox.Sandbox, resumed bool, err error)
	WakeOnTraffic(ctx context.Context, id string) bool
}

var _ Pauser = (*sandbox.Pauses)(nil)

// Activity marks a sandbox used while a request for it is in flight
// (*idle.Tracker implements it); end is idempotent.
type Activity interface {
	Begin(id string) (end func())
}

var _ Activity = (*idle.Tracker)(nil)

// Network is the part of the sandboxes' network side (*fences.Set) the API
// uses: ingress to a sandbox's ports and its policy updates.
type Network interface {
	DialPort(ctx context.Context, id string, port uint16) (net.Conn, error)
	UpdateNetwork(ctx context.Context, id string, allowInternet *bool, n *api.NetworkConfig) error
}

var _ Network = (*fences.Set)(nil)

// Options configure the handler.
type Options struct {
	// Manager runs the sandboxes. Required.
	Manager Manager
	// Pauses pauses and resumes them. Required with Manager.
	Pauses Pauser
	// Network reaches the sandboxes' ports and updates their network.
	// Required with Manager.
	Network Network
	// Moves, if set, answers where a sandbox moved off a drained node
	// went (GET /moved-sandboxes/{id}, moved.go).
	Moves Locator
	// Layers serves the snapshot, fork, checkpoint, rewind and diff
	// routes, and checkpoints the sandboxes created with autoCheckpoint
	// before each command; nil answers 501 there.
	Layers Layers
	// APIKey is the bootstrap key: the admin of the default team (in
	// X-API-Key). If empty, and no Identity, every authenticated route
	// answers 401: the API fails closed.
	APIKey string
	// Identity keeps the teams and their API keys and access tokens, and
	// serves /teams, /api-keys, /access-tokens and the admin routes; nil
	// admits the bootstrap key alone and answers 501 there.
	Identity Identity
	// TeamSandboxes serves the admin routes that count and kill each
	// team's sandboxes; nil answers 501 there.
	TeamSandboxes TeamSandboxes
	// Domain is the sandbox domain: {port}-{id}.{Domain} hosts are sandbox
	// traffic, and it is returned as `domain` to the SDKs. If empty, only
	// {port}-{id}.localhost hosts and the routing headers select sandboxes,
	// and `domain` is null.
	Domain string
	// Logger; nil discards logs.
	Logger *slog.Logger
	// Metrics, if set, is served at GET /metrics to the admin alone (the
	// bootstrap key, in X-API-Key or as a Bearer token, so Prometheus can
	// scrape it): its figures span every team.
	Metrics http.Handler
	// Now returns the current time (signature expiry); nil means time.Now.
	Now func() time.Time
	// Secrets serves /secrets; nil answers 502 there.
	Secrets SecretStore
	// Activity marks the use of sandboxes by their traffic (envd and
	// port requests, each until its end) for the idle pause
	// (*idle.Tracker); nil marks nothing.
	Activity Activity
	// Downloads serves GET /sandboxes/{id}/downloads; nil answers 501.
	Downloads DownloadLog
	// Audit serves GET /audit, GET /audit/stream and the sandbox logs
	// routes (nil answers 501 there), and receives the API's actions and
	// the processes and uploads that go through the sandbox proxy.
	Audit AuditLog
	// Outputs keeps the output of processes started through the proxy.
	Outputs OutputKeeper
	// BodyIdleTimeout bounds the wait for each read of a request body: a
	// client that sends nothing of its body for this long loses the
	// connection, while a long upload that keeps moving is never cut.
	// Zero means one minute.
	BodyIdleTimeout time.Duration
	// Templates serves the template build routes; nil answers 501 there.
	Templates Templates
	// Exporter serves GET /sandboxes/{id}/export; nil answers 501.
	Exporter Exporter
	// Usage serves GET /usage and the sandboxes' metrics routes; nil
	// answers 501 there.
	Usage Usage
	// Quotas serves /teams/{teamID}/limits and limits each key's request
	// rate; nil answers 501 there and limits no rate.
	Quotas *tenancy.Quotas
	// Teams says which teams exist, for the limits routes; nil knows the
	// default team only.
	Teams Teams
	// MCP serves the Model Context Protocol's streamable HTTP transport at
	// /mcp, behind the API key like the other control-plane routes; nil
	// answers 404 there.
	MCP http.Handler
	// SSHKeys serves /ssh-keys; nil answers 501 there.
	SSHKeys SSHKeyStore
	// Approvals serves the egress approval routes (/approvals); nil
	// answers 501 there.
	Approvals Approvals
	// UI serves the dashboard's assets under /ui (its paths without the
	// prefix), and turns on its session routes (uisession.go); nil: no
	// dashboard, /ui answers 404.
	UI http.Handler
	// UISessionTTL is the life of a dashboard session; zero means 12 h.
	UISessionTTL time.Duration
	// AuditVerify serves GET /audit/verify; nil answers 501 there.
	AuditVerify AuditVerifier
	// Volumes serves /volumes, /volumecontent and the volumeMounts of a
	// create; nil answers 403 there ("use of volumes is not enabled").
	Volumes *volume.Service
	// UploadTag starts the token of every upload link the node gives (a
	// cluster node's tag), so that fence router sends an upload to the
	// node that gave its link; empty on a node alone.
	UploadTag string
}

// maxBodyBytes bounds control-plane request bodies.
const maxBodyBytes = 1 << 20

type handler struct {
	m      Manager
	pauses Pauser
	net    Network
	layers Layers // nil: no snapshots, forks, checkpoints
	moves  Locator
	apiKey []byte
	domain string
	log    *slog.Logger
	now    func() time.Time
	mux    *http.ServeMux
	proxy  *httputil.ReverseProxy
	// portProxy reaches the sandbox's other ports.
	portProxy   *httputil.ReverseProxy
	promMetrics http.Handler // nil: no /metrics route
	bodyIdle    time.Duration
	secrets     SecretStore
	downloads   DownloadLog
	audit       AuditLog
	// sink receives what the API did and what went through the sandbox
	// proxy (processes, uploads); outputs keeps processes' output. Nil:
	// nothing is recorded.
	sink       audit.Sink
	outputs    OutputKeeper
	identity   Identity // nil: the bootstrap key alone
	teamBoxes  TeamSandboxes
	revoked    revocations
	signatures signatureIndex
	scans      chan struct{} // a slot per signature scan in progress
	templates  Templates
	exporter   Exporter
	meter      Usage
	mcp        http.Handler   // nil: no /mcp route
	approvals  Approvals      // nil: no approval routes
	warming    sync.WaitGroup // warmAgent calls in flight
	warmups    warmups        // the same, by sandbox, for first requests to wait on
	quotas     *tenancy.Quotas
	teams      Teams
	sshKeys    SSHKeyStore     // nil: no /ssh-keys
	volumes    *volume.Service // nil: no volumes
	activity   Activity        // never nil (noActivity)
	ui         http.Handler    // nil: no dashboard
	uiTTL      time.Duration
	sessions   uiSessions
	// verifyAudit serves GET /audit/verify; nil: 501.
	verifyAudit AuditVerifier
	uploadTag   string // Options.UploadTag
}

// noActivity marks nothing.
type noActivity struct{}

func (noActivity) Begin(string) func() { return func() {} }

// New returns the HTTP handler serving the control plane and sandbox
// traffic.
func New(opts Options) http.Handler {
	h := &handler{
		m:           opts.Manager,
		pauses:      opts.Pauses,
		activity:    opts.Activity,
		net:         opts.Network,
		layers:      opts.Layers,
		moves:       opts.Moves,
		apiKey:      []byte(opts.APIKey),
		domain:      opts.Domain,
		log:         opts.Logger,
		now:         opts.Now,
		promMetrics: opts.Metrics,
		bodyIdle:    opts.BodyIdleTimeout,
		secrets:     opts.Secrets,
		downloads:   opts.Downloads,
		audit:       opts.Audit,
		outputs:     opts.Outputs,
		identity:    opts.Identity,
		teamBoxes:   opts.TeamSandboxes,
		scans:       make(chan struct{}, maxSignatureScans()),
		templates:   opts.Templates,
		exporter:    opts.Exporter,
		meter:       opts.Usage,
		quotas:      opts.Quotas,
		teams:       opts.Teams,
		mcp:         opts.MCP,
		sshKeys:     opts.SSHKeys,
		approvals:   opts.Approvals,
		ui:          opts.UI,
		uiTTL:       opts.UISessionTTL,
		verifyAudit: opts.AuditVerify,
		volumes:     opts.Volumes,
		uploadTag:   opts.UploadTag,
	}
	if h.uiTTL <= 0 {
		h.uiTTL = defaultUISessionTTL
	}
	if opts.Audit != nil {
		h.sink = opts.Audit
	}
	if h.activity == nil {
		h.activity = noActivity{}
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	if h.bodyIdle <= 0 {
		h.bodyIdle = time.Minute
	}
	h.mux = h.routes()
	h.proxy = h.newProxy()
	h.portProxy = h.newPortProxy()
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		r.Body = &idleBody{ReadCloser: r.Body, rc: http.NewResponseController(w), idle: h.bodyIdle}
	}
	if t, ok, err := h.sandboxTarget(r); ok {
		if err != nil {
			writeError(w, r, h.log, err)
			return
		}
		h.serveSandbox(w, r, t)
		return
	}
	if h.ui != nil && isUIPath(r.URL.Path) {
		h.serveUI(w, r)
		return
	}
	if r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" {
		h.serveSignedFiles(w, r)
		return
	}
	if strings.HasPrefix(r.URL.Path, volumeContentPrefix) {
		h.serveVolumeContent(w, r)
		return
	}
	if strings.HasPrefix(r.URL.Path, uploadPrefix) {
		h.serveTemplateUpload(w, r)
		return
	}
	h.serveControl(w, r)
}

func (h *handler) serveControl(w http.ResponseWriter, r *http.Request) {
	if isSecretsPath(r.URL.Path) {
		// Every answer about secrets, errors included, is never cached.
		w.Header().Set("Cache-Control", "no-store")
	}
	_, pattern := h.mux.Handler(r)
	if pattern == "" {
		h.serveUnmatched(w, r)
		return
	}
	if pattern == routeHealth {
		h.mux.ServeHTTP(w, r)
		return
	}
	c, err := h.authenticate(r)
	if err != nil {
		if h.sink != nil && errors.Is(err, errUnauthenticated) {
			h.sink.Append(context.WithoutCancel(r.Context()), audit.Event{Type: audit.TypeAPI, Actor: "unauthenticated",
				Data: map[string]any{"method": r.Method, "route": pattern, "path": r.URL.Path, "status": http.StatusUnauthorized}})
		}
		writeError(w, r, h.log, err)
		return
	}
	r, stop := h.withCaller(r, c)
	defer stop()
	if !h.allowRate(w, r) {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
	if h.sink == nil {
		h.dispatch(w, r, pattern)
		return
	}
	who := actor(c.p)
	r = r.WithContext(audit.WithActor(r.Context(), who))
	tw := &tapWriter{ResponseWriter: w}
	h.dispatch(tw, r, pattern)
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return // reads are not actions
	}
	h.sink.Append(context.WithoutCancel(r.Context()), audit.Event{Type: audit.TypeAPI, SandboxID: r.PathValue("id"),
		Actor: who, Data: map[string]any{"method": r.Method, "route": pattern, "path": r.URL.Path, "status": tw.status}})
}

// dispatch serves r on its route once the ownership gate passed it.
func (h *handler) dispatch(w http.ResponseWriter, r *http.Request, pattern string) {
	if err := auditorGate(r, pattern); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if err := h.checkOwner(r, pattern); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// serveUnmatched answers requests no route takes: 405 when the path exists
// with other methods, else 404, both as JSON.
func (h *handler) serveUnmatched(w http.ResponseWriter, r *http.Request) {
	rec := &headerRecorder{header: http.Header{}}
	fallback, _ := h.mux.Handler(r)
	fallback.ServeHTTP(rec, r)
	if rec.status == http.StatusMethodNotAllowed {
		if allow := rec.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		writeError(w, r, h.log, errorf(errMethodNotAllowed, "method %s is not allowed on %s", r.Method, r.URL.Path))
		return
	}
	writeError(w, r, h.log, errorf(errNoRoute, "no route for %s %s", r.Method, r.URL.Path))
}

// headerRecorder captures the status and headers of the mux's fallback
// handlers and drops their plain-text bodies.
type headerRecorder struct {
	header http.Header
	status int
}

func (r *headerRecorder) Header() http.Header { return r.header }
func (r *headerRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return len(b), nil
}
func (r *headerRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
