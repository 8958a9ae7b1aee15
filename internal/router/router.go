// Package router is `fence router`: one E2B endpoint in front of many fence
// nodes. It serves the same API and sandbox traffic as one `fence serve`,
// and keeps no state of its own: the nodes and their load come from a
// cluster.Watcher, and the node of a sandbox from the sandbox's ID. It
// reads requests by the daemon's own rules, which live in the wire
// contract (api.SandboxTarget, api.ValidSandboxID, api.PageToken), and
// links none of the daemon's packages.
//
// # Guarantees
//
//   - Control-plane routes other than GET /health require the API key in
//     X-API-Key (or, on GET /metrics, as a Bearer token), compared in
//     constant time, before anything reaches a node; the API fails closed
//     without a key. With SharedRecords, another key (a team's API key in
//     X-API-Key, or an access token as a Bearer token) is passed on and
//     checked by the node, against the database every node shares.
//   - A create goes to a live node that is not draining, preferring nodes
//     that have the template, the best of K random candidates by free
//     capacity (less the creates this router has in flight to it). A node
//     that cannot be reached or answers 503/429 is skipped for the next.
//     Only nodes that have the template are candidates, unless none has
//     it or the nodes pull templates from one content registry
//     (SharedRecords and SharedContent): then the others follow.
//   - Every later call and all sandbox traffic (envd, other ports,
//     WebSocket and streams, headers or {port}-{id}.{domain} hosts) go to
//     the node named by the sandbox ID's tag, with no lookup in Kubernetes.
//     Host and body are passed through untouched; the response streams.
//   - A sandbox whose node is dead is reported gone: 404 on the control
//     plane (a live node answers for it), 502 api.ProxyError for its
//     traffic.
//   - Lists and /metrics aggregate every live node; v2 lists keep E2B's
//     pagination (limit, nextToken, X-Next-Token) across nodes.
//   - What each node keeps of its own is answered for the cluster
//     (pernode.go): /audit, /audit/stream, /audit/verify and /usage ask
//     every live node with the caller's credentials (never the router's
//     key for a team's) and merge the answers (audit records by time, each
//     naming its node, paged by a cursor of every node's seq; usage
//     summed); a live node that does not answer is named in
//     api.HeaderUnansweredNodes.
//   - /mcp is served by the router itself (Options.MCP, which fence router
//     sets to mcp.ClusterHandler): stateless, its tools a client of the
//     router's own API, so they see every node. Without it /mcp is 501.
//   - /secrets answers 501 but when the nodes share one database
//     (SharedRecords): then any live node answers it for the cluster. No
//     other route a single node serves answers 501.
//   - With SharedRecords, a sandbox whose tag's node is drained or dead
//     is looked up on a live node (GET /moved-sandboxes/{id}): a
//     sandbox moved off its node (fence serve --drain-moves) is served by
//     the node that took it over, and its connect or resume goes to a
//     placeable node while it waits in the registry (moved.go).
//   - Volumes (/volumes, /volumecontent) go to the node that holds them,
//     found by asking the nodes, and a create with volumeMounts to the node
//     of its volumes (volumes.go), with SharedRecords too (a volume's
//     record is its node's, not shared).
//   - A template build's routes go to one node for the caller's
//     credential, and an upload link to the node that gave it (builds.go).
//   - Nodes see the cluster token on every request from the router; a
//     client's own X-Fence-Cluster-Token header is replaced, never passed.
//   - With Options.UI the router serves the web dashboard at /ui, its
//     sessions sealed in their cookie with a key derived from the cluster
//     token, so that any router replica takes them; a session's calls
//     reach the nodes with the session's credential (ui.go). Without it
//     /ui answers 404 and is never passed to a node.
//   - Shutdown: SetDraining makes GET /health answer 503 (load balancers
//     stop sending) and every answer close its connection (a client's
//     next request takes a new one, to a ready router), and the server's
//     Shutdown lets requests in flight end.
package router

import (
	"bytes"
	"cmp"
	"context"
	"crypto/cipher"
	"crypto/subtle"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/ui"
)

// Nodes is what the router knows of the cluster (a *cluster.Watcher).
type Nodes interface {
	Node(tag string) (cluster.Node, bool)
	Nodes() []cluster.Node
}

// Options configure a Router.
type Options struct {
	Nodes Nodes // required
	// APIKey clients must present; empty refuses every authenticated call.
	APIKey string
	// Token is the cluster token sent to nodes.
	Token string
	// Domain is the sandbox domain, as on the nodes.
	Domain string
	// Transport reaches the nodes; nil means a clone of
	// http.DefaultTransport.
	Transport http.RoundTripper
	// K is how many random candidates a create compares; 0 means 2.
	K int
	// SharedRecords says the nodes keep their shared records in one
	// database (fence serve --database): every node gives the same answer
	// on /secrets, which is then sent to any live node instead of 501,
	// and every node knows every team's keys, so a key other than APIKey
	// is passed to the nodes, which check it, instead of refused.
	SharedRecords bool
	// UI serves the dashboard's pages (ui.Handler()) at /ui, with its
	// sessions (ui.go); nil serves no dashboard.
	UI http.Handler
	// UISessionTTL is a dashboard session's life; 0 means
	// DefaultUISessionTTL.
	UISessionTTL time.Duration
	// Now is the clock of session expiry; nil means time.Now.
	Now func() time.Time
	// SharedContent says the nodes move templates through one content
	// registry (fence serve --registry): with SharedRecords, a create
	// may go to a node without the template, which pulls it, after the
	// nodes that have it.
	SharedContent bool
	// MCP makes the handler of /mcp from the router's own API (api is the
	// router); stop is called by Close. nil answers /mcp 501.
	MCP    func(api http.Handler) (handler http.Handler, stop func())
	Logger *slog.Logger
}

// Router is the http.Handler of `fence router`.
type Router struct {
	nodes    Nodes
	apiKey   []byte
	token    string
	domain   string
	k        int
	log      *slog.Logger
	tr       http.RoundTripper
	proxy    *httputil.ReverseProxy
	client   *http.Client
	draining atomic.Bool
	pending  sync.Map // node name → *atomic.Int64: creates in flight
	perNode  []string // the routes answered 501 (notThroughRouter less the shared)
	mcp      http.Handler
	stopMCP  func()
	teamKeys bool // the nodes check keys other than apiKey (SharedRecords)
	ui       http.Handler
	seal     cipher.AEAD // of dashboard sessions, keyed from token
	uiTTL    time.Duration
	now      func() time.Time
	anyNode  bool // a create may go to a node without its template (SharedRecords and SharedContent)
}

const maxBodyBytes = 1 << 20

type ctxKey struct{}

// route is where one proxied request goes.
type route struct {
	node      cluster.Node
	sandboxID string // set for sandbox traffic: its errors are ProxyErrors
	failed    atomic.Bool
}

// New returns a Router.
func New(opts Options) *Router {
	rt := &Router{nodes: opts.Nodes, apiKey: []byte(opts.APIKey), token: opts.Token, domain: opts.Domain,
		k: cmp.Or(opts.K, 2), log: opts.Logger, tr: opts.Transport, perNode: notThroughRouter,
		ui: opts.UI, seal: uiSeal(opts.Token), uiTTL: cmp.Or(opts.UISessionTTL, DefaultUISessionTTL), now: opts.Now}
	if rt.now == nil {
		rt.now = time.Now
	}
	if rt.log == nil {
		rt.log = slog.New(slog.DiscardHandler)
	}
	if opts.SharedRecords {
		rt.teamKeys = true
		rt.anyNode = opts.SharedContent
		rt.perNode = slices.DeleteFunc(slices.Clone(notThroughRouter), func(p string) bool { return slices.Contains(sharedRoutes, p) })
	}
	if rt.tr == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 256
		t.ResponseHeaderTimeout = 0
		rt.tr = t
	}
	rt.client = &http.Client{Transport: rt.tr, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	rt.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			ro := pr.In.Context().Value(ctxKey{}).(*route)
			u, _ := url.Parse(ro.node.URL)
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host // sandbox hosts route on the node too
			pr.Out.Header.Set(cluster.HeaderToken, rt.token)
		},
		Transport:     rt.tr,
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(rt.log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			ro := r.Context().Value(ctxKey{}).(*route)
			ro.failed.Store(true)
			rt.log.Warn("node unreachable", "node", ro.node.Name, "path", r.URL.Path, "err", err)
			if ro.sandboxID != "" {
				writeJSON(w, http.StatusBadGateway, api.ProxyError{SandboxID: ro.sandboxID,
					Message: "The sandbox's node did not answer", Code: http.StatusBadGateway})
				return
			}
			writeErr(w, http.StatusBadGateway, "fence node "+ro.node.Name+" did not answer")
		},
	}
	rt.stopMCP = func() {}
	if opts.MCP != nil {
		rt.mcp, rt.stopMCP = opts.MCP(rt)
	}
	return rt
}

// Close closes the in-process connections of the router's /mcp.
func (rt *Router) Close() { rt.stopMCP() }

// SetDraining makes GET /health answer 503 and every answer close its
// connection, for a graceful shutdown.
func (rt *Router) SetDraining() { rt.draining.Store(true) }

func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rt.draining.Load() {
		// A Service balances connections, not requests: a client's
		// kept-alive connection would bring its next requests here until
		// the listener closes, and a request sent on it just as the
		// shutdown closes it idle fails (a stream cannot be retried).
		// Closed after this answer, the client's next connection goes to
		// a router that is ready.
		w.Header().Set("Connection", "close")
	}
	if id, _, ok, err := api.SandboxTarget(r, rt.domain); ok {
		ui.StripSession(r.Header)
		rt.serveSandbox(w, r, id, err)
		return
	}
	if isUIPath(r.URL.Path) {
		rt.serveUI(w, r)
		return
	}
	if r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" {
		ui.StripSession(r.Header)
		rt.serveSignedFiles(w, r)
		return
	}
	if r.URL.Path == "/health" && r.Method == http.MethodGet {
		if rt.draining.Load() {
			writeErr(w, http.StatusServiceUnavailable, "router is shutting down")
			return
		}
		nodes := rt.nodes.Nodes()
		placeable := 0
		for _, n := range nodes {
			if n.Placeable() {
				placeable++
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "nodes": len(nodes), "placeable": placeable})
		return
	}
	if strings.HasPrefix(r.URL.Path, uploadPrefix) {
		// A link's token, not an API key: its node checks it (builds.go).
		rt.serveUpload(w, r)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/volumecontent/") {
		// A volume token, not an API key: its node checks it.
		ui.StripSession(r.Header)
		rt.serveVolumeContent(w, r)
		return
	}
	// A dashboard session is its credential, checked here and sent on.
	if rt.ui != nil && hasSession(r) && !rt.sessionCredential(w, r) {
		return
	}
	ui.StripSession(r.Header)
	if !rt.authenticated(r) {
		msg := "invalid API key"
		if r.Header.Get("X-API-Key") == "" {
			msg = "missing API key: send it in the X-API-Key header"
		}
		writeErr(w, http.StatusUnauthorized, msg)
		return
	}
	rt.serveControl(w, r)
}

func (rt *Router) authenticated(r *http.Request) bool {
	got := []byte(r.Header.Get("X-API-Key"))
	if len(got) == 0 && r.URL.Path == "/metrics" {
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			got = []byte(tok)
		}
	}
	if len(rt.apiKey) > 0 && subtle.ConstantTimeCompare(got, rt.apiKey) == 1 {
		return true
	}
	// Nodes on one database check a team's API key or access token
	// themselves, on every request (a revoked one fails at once on all).
	bearer := strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ")
	return rt.teamKeys && r.URL.Path != "/metrics" && (len(got) > 0 || bearer)
}

func (rt *Router) serveSandbox(w http.ResponseWriter, r *http.Request, id string, bad error) {
	if bad != nil {
		// The node's own answer to a malformed target.
		rt.forwardAny(w, r)
		return
	}
	n, ok := rt.movedNode(r, id, false)
	if !ok {
		n, ok = rt.nodeOf(id)
	}
	if !ok {
		writeJSON(w, http.StatusBadGateway, api.ProxyError{SandboxID: id, Message: "The sandbox was not found",
			Code: http.StatusBadGateway})
		return
	}
	rt.forward(w, r, &route{node: n, sandboxID: id})
}

func (rt *Router) nodeOf(id string) (cluster.Node, bool) {
	tag, ok := cluster.TagOf(id)
	if !ok || !api.ValidSandboxID(id) {
		return cluster.Node{}, false
	}
	return rt.nodes.Node(tag)
}

func (rt *Router) forward(w http.ResponseWriter, r *http.Request, ro *route) {
	// A node may answer before the whole request body has gone through (a
	// stream's first event while the request's last bytes are in flight);
	// without full duplex net/http closes the body at the first response
	// write, the transport's copy of it fails, and the transport drops the
	// connection to the node: the client saw its stream cut.
	_ = http.NewResponseController(w).EnableFullDuplex()
	rt.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, ro)))
}

// forwardAny sends r to some live node, for the answers every node gives
// alike (errors, unknown sandboxes, unsupported routes).
func (rt *Router) forwardAny(w http.ResponseWriter, r *http.Request) {
	nodes := rt.nodes.Nodes()
	if len(nodes) == 0 {
		writeErr(w, http.StatusServiceUnavailable, "no fence node is live")
		return
	}
	rt.forward(w, r, &route{node: nodes[rand.IntN(len(nodes))]})
}

// notThroughRouter are the fence extensions kept per node, which one
// node's answer would misstate for the cluster.
var notThroughRouter = []string{"/secrets"}

// sharedRoutes are those of notThroughRouter every node answers alike
// when the nodes share one database (Options.SharedRecords).
var sharedRoutes = []string{"/secrets"}

func (rt *Router) serveControl(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	for _, pre := range rt.perNode {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			writeErr(w, http.StatusNotImplemented, p+" is kept per node and is not served through fence router")
			return
		}
	}
	if h := rt.merged(r); h != nil {
		h(w, r)
		return
	}
	if isBuildRoute(r) {
		rt.serveBuild(w, r)
		return
	}
	switch {
	case r.Method == http.MethodPost && (p == "/sandboxes" || p == "/v2/sandboxes"):
		rt.create(w, r)
		return
	case r.Method == http.MethodGet && p == "/sandboxes":
		rt.listV1(w, r)
		return
	case r.Method == http.MethodGet && p == "/v2/sandboxes":
		rt.listV2(w, r)
		return
	case r.Method == http.MethodGet && p == "/metrics":
		rt.metrics(w, r)
		return
	case p == "/volumes" || strings.HasPrefix(p, "/volumes/"):
		rt.serveVolumes(w, r)
		return
	case p == "/mcp" && rt.mcp != nil:
		rt.mcp.ServeHTTP(w, r)
		return
	case p == "/mcp":
		writeErr(w, http.StatusNotImplemented, "/mcp is not served by this router")
		return
	}
	rest, ok := strings.CutPrefix(strings.TrimPrefix(p, "/v2"), "/sandboxes/")
	if ok {
		id, sub, _ := strings.Cut(rest, "/")
		resume := r.Method == http.MethodPost && (sub == "connect" || sub == "resume")
		if n, ok := rt.movedNode(r, id, resume); ok {
			rt.forward(w, r, &route{node: n})
			return
		}
		if n, ok := rt.nodeOf(id); ok {
			rt.forward(w, r, &route{node: n})
			return
		}
	}
	// Unknown or gone sandboxes, unsupported routes: any node answers them
	// as the cluster would (404 for a sandbox of a dead node).
	rt.forwardAny(w, r)
}

// create places a sandbox.
func (rt *Router) create(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeErr(w, http.StatusBadRequest, "reading the request body: "+err.Error())
		return
	}
	var req struct {
		TemplateID   string            `json:"templateID"`
		VolumeMounts []api.VolumeMount `json:"volumeMounts"`
	}
	_ = json.Unmarshal(body, &req) // a bad body gets the node's own error
	if len(req.VolumeMounts) > 0 {
		// The sandbox goes where its volumes are, or nowhere.
		n, ok := rt.mountsNode(w, r, req.VolumeMounts)
		if !ok {
			return
		}
		if n.Name != "" {
			rt.placeBody(w, r, []cluster.Node{n}, body)
			return
		}
	}
	rt.placeBody(w, r, rt.place(req.TemplateID), body)
}

// tryCreate sends the create to n; it reports false, having written
// nothing, when n could not take it and another node should be tried.
func (rt *Router) tryCreate(w http.ResponseWriter, r *http.Request, n cluster.Node, body []byte, last bool) bool {
	c := rt.pendingOf(n.Name)
	c.Add(1)
	defer c.Add(-1)
	u, _ := url.Parse(n.URL)
	u.Path, u.RawQuery = r.URL.Path, r.URL.RawQuery
	out, err := http.NewRequestWithContext(r.Context(), http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return true
	}
	out.Header = r.Header.Clone()
	out.Header.Del("Connection")
	out.Header.Set(cluster.HeaderToken, rt.token)
	resp, err := rt.tr.RoundTrip(out)
	if err != nil {
		rt.log.Warn("create: node unreachable", "node", n.Name, "err", err)
		if last {
			writeErr(w, http.StatusBadGateway, "fence node "+n.Name+" did not answer")
		}
		return false
	}
	defer resp.Body.Close()
	if !last && (resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests) {
		rt.log.Info("create: node full, trying another", "node", n.Name, "status", resp.StatusCode)
		return false
	}
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
	return true
}

func (rt *Router) pendingOf(name string) *atomic.Int64 {
	v, _ := rt.pending.LoadOrStore(name, new(atomic.Int64))
	return v.(*atomic.Int64)
}

// place orders the candidate nodes of a create: first the best of K random
// placeable nodes having the template (by free capacity less creates in
// flight), then the others having it by the same measure, then (when
// nodes pull the templates they lack, or when no node has it) those
// without it by the same measure.
func (rt *Router) place(template string) []cluster.Node {
	var with, without []cluster.Node
	for _, n := range rt.nodes.Nodes() {
		if !n.Placeable() {
			continue
		}
		if n.HasTemplate(template) {
			with = append(with, n)
		} else {
			without = append(without, n)
		}
	}
	free := func(n cluster.Node) int64 { return int64(n.Free()) - rt.pendingOf(n.Name).Load() }
	byFree := func(a, b cluster.Node) int { return cmp.Compare(free(b), free(a)) }
	pool := with
	if len(pool) == 0 {
		pool, without = without, nil // no node has it: a node says so, builds or pulls it
	}
	if len(pool) == 0 {
		return nil
	}
	var after []cluster.Node
	if rt.anyNode {
		after = slices.Clone(without)
		slices.SortStableFunc(after, byFree)
	}
	rand.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
	k := min(rt.k, len(pool))
	best := slices.MaxFunc(pool[:k], func(a, b cluster.Node) int { return cmp.Compare(free(a), free(b)) })
	rest := slices.DeleteFunc(slices.Clone(pool), func(n cluster.Node) bool { return n.Name == best.Name })
	slices.SortStableFunc(rest, byFree)
	return append(append([]cluster.Node{best}, rest...), after...)
}

// nodeAnswer is one node's answer to a fan-out.
type nodeAnswer struct {
	node   cluster.Node
	status int
	header http.Header
	body   []byte
	err    error
}

// fanOut sends a body-less GET to every live node at once.
func (rt *Router) fanOut(r *http.Request) []nodeAnswer {
	return rt.fanOutQuery(r, func(cluster.Node) string { return r.URL.RawQuery })
}

// fanOutQuery is fanOut with each node's query given by query, in the
// order of the nodes' names; the caller's credentials (never the
// router's) go with it.
func (rt *Router) fanOutQuery(r *http.Request, query func(cluster.Node) string) []nodeAnswer {
	return rt.fanOutWith(r, rt.client, query)
}

// fanOutWith is fanOutQuery through c.
func (rt *Router) fanOutWith(r *http.Request, c *http.Client, query func(cluster.Node) string) []nodeAnswer {
	nodes := rt.nodes.Nodes()
	slices.SortFunc(nodes, func(a, b cluster.Node) int { return strings.Compare(a.Name, b.Name) })
	out := make([]nodeAnswer, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			a := nodeAnswer{node: n}
			defer func() { out[i] = a }()
			u, _ := url.Parse(n.URL)
			u.Path, u.RawQuery = r.URL.Path, query(n)
			req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, u.String(), nil)
			if err != nil {
				a.err = err
				return
			}
			for _, h := range []string{"X-API-Key", "Authorization", "Accept", "X-Team-ID"} {
				if v := r.Header.Get(h); v != "" {
					req.Header.Set(h, v)
				}
			}
			req.Header.Set(cluster.HeaderToken, rt.token)
			resp, err := c.Do(req)
			if err != nil {
				a.err = err
				return
			}
			defer resp.Body.Close()
			a.status, a.header = resp.StatusCode, resp.Header
			a.body, a.err = io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		})
	}
	wg.Wait()
	return out
}

// serveSignedFiles serves a signed /files URL that names no sandbox (the
// SDKs' download and upload URLs when E2B_SANDBOX_URL is set): the
// signature belongs to one sandbox of one node. Each node is asked in
// turn, without the body (api.HeaderSignatureProbe), whether it holds
// that sandbox; the request goes to the first that does. A node that
// holds none answers "invalid signature"; any other answer (an expired
// signature among them) is the owner's and is passed on.
func (rt *Router) serveSignedFiles(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost:
	default:
		writeErr(w, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed on /files")
		return
	}
	method := r.Method
	if method == http.MethodHead {
		method = http.MethodGet // the signature is for a read
	}
	var last *http.Response
	var lastBody []byte
nodes:
	for _, n := range rt.nodes.Nodes() {
		u, _ := url.Parse(n.URL)
		u.Path, u.RawQuery = r.URL.Path, r.URL.RawQuery
		probe, err := http.NewRequestWithContext(r.Context(), method, u.String(), http.NoBody)
		if err != nil {
			continue
		}
		probe.Header.Set(api.HeaderSignatureProbe, "1")
		probe.Header.Set(cluster.HeaderToken, rt.token)
		resp, err := rt.tr.RoundTrip(probe)
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		last, lastBody = resp, b
		switch {
		case resp.StatusCode == http.StatusNoContent:
			rt.forward(w, r, &route{node: n})
			return
		case resp.StatusCode == http.StatusBadGateway,
			resp.StatusCode == http.StatusUnauthorized && bytes.Contains(b, []byte("invalid signature")):
			continue // not this node's
		default:
			break nodes // the owner's refusal
		}
	}
	if last == nil {
		writeErr(w, http.StatusServiceUnavailable, "no fence node is live")
		return
	}
	copyHeader(w.Header(), last.Header)
	w.Header().Del("Content-Length")
	w.WriteHeader(last.StatusCode)
	w.Write(lastBody)
}

var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Trailer"}

func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		if slices.Contains(hopHeaders, http.CanonicalHeaderKey(k)) {
			continue
		}
		dst[k] = append([]string(nil), vv...)
	}
}

func writeErr(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, api.Error{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
