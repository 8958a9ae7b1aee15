package httpapi

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/ui"
)

// target is the sandbox and port a request is addressed to.
type target struct {
	id   string
	port int
}

// hostSuffix is appended to sandbox IDs in the proxy's upstream URLs, so
// the Transport pools connections per sandbox and can find the sandbox
// again in DialContext.
const hostSuffix = ".sandbox.fence.internal"

// internalPaths are the agent routes only the daemon may call (reference
// §2.7, x-internal in envd.yaml).
var internalPaths = map[string]bool{
	"/init": true, "/freeze": true, "/unfreeze": true, "/collapse": true,
	"/fsfreeze": true, "/fsthaw": true, "/upgrade": true,
}

// msgUnauthorized is envd's own 401 message.
const msgUnauthorized = "unauthorized access, please provide a valid access token or method signing if supported"

// sandboxTarget reports whether r is sandbox traffic and to where
// (api.SandboxTarget with the daemon's domain). A request that names a
// sandbox badly is sandbox traffic with an error.
func (h *handler) sandboxTarget(r *http.Request) (target, bool, error) {
	id, port, ok, err := api.SandboxTarget(r, h.domain)
	return target{id: id, port: port}, ok, err
}

func writeNotFound(w http.ResponseWriter, id, msg string) {
	writeJSON(w, http.StatusBadGateway, api.ProxyError{SandboxID: id, Message: msg, Code: http.StatusBadGateway})
}

const msgSandboxNotFound = "The sandbox was not found"

type proxyStateKey struct{}

// proxyState is shared by one proxied request and the proxy's hooks.
type proxyState struct {
	id         string
	port       int    // a sandbox port other than the agent's; 0 for the agent
	mask       string // maskRequestHost: the Host sent to the port (${PORT} replaced)
	path       string
	signed     bool   // a /files request let in by its URL signature
	user       string // envd user named by Basic auth, when hasUser
	hasUser    bool
	actor      string          // who acts, for the audit trail
	runDone    <-chan struct{} // closed when the sandbox is paused
	inc        uint64          // the sandbox's incarnation (see proxyHost)
	killed     atomic.Bool     // the sandbox stopped (or was paused) while the request ran
	errHandled atomic.Bool     // ErrorHandler answered the request
}

// running returns the backend handle and a copy of running sandbox id,
// for its traffic: false for unknown, killed and paused sandboxes. The
// copy's RunDone is closed when the sandbox is paused.
func (h *handler) running(id string) (isolation.Sandbox, *sandbox.Sandbox, bool) {
	info, box, err := h.m.Live(id)
	if err != nil || info.State != sandbox.StateRunning {
		return nil, nil, false
	}
	return box, info, true
}

func (h *handler) serveSandbox(w http.ResponseWriter, r *http.Request, t target) {
	r, stop, err := h.sandboxCaller(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	defer stop()
	if !api.ValidSandboxID(t.id) {
		writeNotFound(w, t.id, msgSandboxNotFound)
		return
	}
	// In use until the request ends (for the idle pause): marked before
	// the sandbox is looked at, so that an idle pause deciding meanwhile
	// sees it.
	defer h.activity.Begin(t.id)()
	box, info, ok := h.running(t.id)
	if !ok && h.pauses.WakeOnTraffic(r.Context(), t.id) {
		// A paused sandbox created with autoResume runs again for it.
		box, info, ok = h.running(t.id)
	}
	if !ok {
		writeNotFound(w, t.id, msgSandboxNotFound)
		return
	}
	if t.port != api.EnvdPort {
		h.servePort(w, r, t, box, info)
		return
	}
	p := path.Clean("/" + r.URL.Path)
	if internalPaths[strings.ToLower(strings.TrimSuffix(p, "/"))] {
		writeError(w, r, h.log, errorf(api.ErrPermissionDenied, "%s is internal to the sandbox agent", p))
		return
	}
	signed, err := h.authorizeSandbox(r, info.EnvdAccessToken, p)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	user, hasUser, err := basicUser(r.Header)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	st := &proxyState{id: t.id, path: p, signed: signed, user: user, hasUser: hasUser, actor: "envd-token",
		runDone: info.RunDone, inc: info.Incarnation}
	if signed {
		st.actor = "signed-url"
	}
	// A first command right after the create takes the connection its
	// warm-up is making.
	h.warmups.wait(r.Context(), t.id)
	w, r, done := h.tapEnvd(w, r, st)
	defer done()
	h.forward(w, r, h.proxy, box, st)
}

// servePort forwards a request to a port of the sandbox other than the
// agent's (a server the sandbox runs: sandbox.getHost(port)), HTTP or
// WebSocket, through the sandbox's network stack. A sandbox created with
// allowPublicTraffic false requires its traffic access token.
func (h *handler) servePort(w http.ResponseWriter, r *http.Request, t target, box isolation.Sandbox, info *sandbox.Sandbox) {
	if tok := info.TrafficAccessToken; tok != "" {
		got := r.Header.Get(api.HeaderTrafficToken)
		if subtle.ConstantTimeCompare([]byte(got), []byte(tok)) != 1 {
			writeError(w, r, h.log, errorf(api.ErrPermissionDenied,
				"this sandbox's ports need its traffic access token in the %s header", api.HeaderTrafficToken))
			return
		}
	}
	h.forward(w, r, h.portProxy, box, &proxyState{id: t.id, port: t.port, path: r.URL.Path, mask: info.MaskRequestHost,
		runDone: info.RunDone, inc: info.Incarnation})
}

// forward proxies r with p, and aborts the response if the sandbox dies
// or is paused while it runs.
func (h *handler) forward(w http.ResponseWriter, r *http.Request, p *httputil.ReverseProxy, box isolation.Sandbox, st *proxyState) {
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), proxyStateKey{}, st))
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-box.Done():
			st.killed.Store(true)
			cancel()
		case <-st.runDone: // nil (never) when the manager gives none
			st.killed.Store(true)
			cancel()
		case <-ctx.Done():
		}
	}()
	// Streams answer while the request body may still be in flight; without
	// full duplex net/http would close the body at the first response write.
	http.NewResponseController(w).EnableFullDuplex()
	rw := &trackingWriter{ResponseWriter: w}
	p.ServeHTTP(rw, r.WithContext(ctx))
	cancel()
	<-stopped
	if st.killed.Load() && rw.wroteHeader && !st.errHandled.Load() {
		// The sandbox died mid-response: abort the connection so the client
		// sees a broken stream, not a clean end.
		panic(http.ErrAbortHandler)
	}
}

// authorizeSandbox checks the access token (or a /files signature) of a
// request to the agent, as envd itself would. It reports
// whether the request was let in by its URL signature.
func (h *handler) authorizeSandbox(r *http.Request, token, p string) (signed bool, err error) {
	if token == "" || (p == "/health" && r.Method == http.MethodGet) {
		return false, nil
	}
	if got := r.Header.Get(api.HeaderAccessToken); got != "" {
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
			return false, nil
		}
		return false, errorf(errUnauthenticated, "%s", msgUnauthorized)
	}
	if p == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) {
		op := "read"
		if r.Method == http.MethodPost {
			op = "write"
		}
		if err := checkSignature(r.URL.Query(), op, token, h.now()); err != nil {
			return false, errorf(errUnauthenticated, "%s", err.Error())
		}
		return true, nil
	}
	return false, errorf(errUnauthenticated, "%s", msgUnauthorized)
}

// basicUser returns the user a request to the agent names, as envd reads
// it: the user name of Basic auth (the SDKs send `Basic base64("user:")`).
// Another scheme or an undecodable value is refused, as envd would.
func basicUser(hdr http.Header) (user string, ok bool, err error) {
	v := hdr.Get("Authorization")
	if v == "" {
		return "", false, nil
	}
	bad := errorf(errUnauthenticated, "the Authorization header must be Basic auth naming a user")
	enc, ok := cutPrefixFold(v, "Basic ")
	if !ok {
		return "", false, bad
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", false, bad
	}
	user, _, _ = strings.Cut(string(raw), ":")
	return user, true, nil
}

// proxyHost is the host the proxies' transports pool connections by: the
// sandbox, the port (0 for the agent) and the sandbox's incarnation, so
// that a connection kept open to the processes a rewind or a resume
// replaced is never reused for the new ones (it would be written into a
// dying agent's socket and reset).
func proxyHost(id string, port int, inc uint64) string {
	if port == 0 {
		return fmt.Sprintf("%s-%d%s", id, inc, hostSuffix)
	}
	return fmt.Sprintf("%s-%d-%d%s", id, port, inc, hostSuffix)
}

// agentWarmTimeout bounds warmAgent's request.
const agentWarmTimeout = 5 * time.Second

// warmAgent makes the proxy's connection to a new sandbox's agent ahead of
// the first request, with one health check, and leaves it idle in the
// proxy's pool: the sandbox's first command then finds it there instead
// of paying the dial, the agent's accept and its first request's setup in
// its round trip. The answer is read (a few bytes at most) and dropped;
// any failure leaves the first request to dial as it would have.
func (h *handler) warmAgent(id string) {
	_, info, ok := h.running(id)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), agentWarmTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+proxyHost(id, 0, info.Incarnation)+"/health", nil)
	if err != nil {
		return
	}
	req.Host = "localhost"
	resp, err := h.proxy.Transport.RoundTrip(req)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if agentWarmed != nil {
		agentWarmed(id)
	}
}

// agentWarmed, when set (by tests), is called once warmAgent's connection
// is back in the proxy's pool.
var agentWarmed func(id string)

// maxIdleConns bounds the idle connections each proxy keeps to all
// sandboxes together (the least recently used goes first): each is one of
// the daemon's descriptors, and a node of thousands of idle sandboxes,
// each exec'd once, must not spend its descriptor limit on them.
const maxIdleConns = 256

func (h *handler) newProxy() *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			id, _, _ := strings.Cut(strings.TrimSuffix(host, hostSuffix), "-")
			box, _, ok := h.running(id)
			if !ok {
				return nil, fmt.Errorf("dialing sandbox %s: %w", id, isolation.ErrNotFound)
			}
			return box.DialAgent(ctx)
		},
		MaxIdleConnsPerHost:   16,
		MaxIdleConns:          maxIdleConns,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // streams may take their time; the client's context bounds them
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			st := pr.In.Context().Value(proxyStateKey{}).(*proxyState)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = proxyHost(st.id, 0, st.inc)
			pr.Out.URL.Path = st.path
			pr.Out.URL.RawPath = ""
			pr.Out.Host = "localhost"
			// The agent gets the user and nothing else of Authorization: a
			// password could only be some other service's credential.
			h.stripCredentials(pr.Out.Header)
			pr.Out.Header.Del("Authorization")
			if st.hasUser {
				pr.Out.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(st.user+":")))
			}
			if st.signed {
				q := pr.Out.URL.Query()
				q.Del("signature")
				q.Del("signature_expiration")
				pr.Out.URL.RawQuery = q.Encode()
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: h.proxyErrorHandler(func(w http.ResponseWriter, r *http.Request, st *proxyState, err error) {
			h.log.WarnContext(r.Context(), "proxying to sandbox agent", "sandbox_id", st.id, "err", err)
			writeNotFound(w, st.id, "The sandbox agent did not answer")
		}),
	}
}

// fenceHeaders are the headers that carry a credential for fence or route
// a request to a sandbox. Nothing inside a sandbox is trusted, so none of
// them reaches it.
var fenceHeaders = []string{api.HeaderAPIKey, api.HeaderAccessToken, api.HeaderTrafficToken,
	api.HeaderSandboxID, api.HeaderSandboxPort, headerAdminToken, HeaderTeamID}

// stripCredentials removes fence's credentials from a request about to be
// forwarded into a sandbox: fenceHeaders, and an Authorization header that
// carries the bootstrap key, or anything shaped like an API key or access
// token, as a Bearer token.
func (h *handler) stripCredentials(hdr http.Header) {
	for _, k := range fenceHeaders {
		hdr.Del(k)
	}
	ui.StripSession(hdr)
	for _, v := range hdr.Values("Authorization") {
		tok, ok := cutPrefixFold(v, "Bearer ")
		tok = strings.TrimSpace(tok)
		if ok && (h.isBootstrap(tok) || store.WellFormed(store.KindAPIKey, tok) || store.WellFormed(store.KindAccessToken, tok)) {
			hdr.Del("Authorization")
			break
		}
	}
}

// sandboxCaller checks the fence credential a request to a sandbox carries,
// if any (X-API-Key, or a Bearer API key or access token): sandbox traffic
// needs none (the sandbox's access token, traffic token or a URL signature
// lets it in), but one that is shown must be live, so a revoked key is
// refused on its next request here too, and its requests in flight end
// when it is revoked. The request returned carries the principal.
func (h *handler) sandboxCaller(r *http.Request) (*http.Request, func(), error) {
	none := func() {}
	if r.Header.Get(api.HeaderAPIKey) == "" && r.Header.Get(headerAdminToken) == "" {
		tok, ok := cutPrefixFold(r.Header.Get("Authorization"), "Bearer ")
		tok = strings.TrimSpace(tok)
		k := store.KindAPIKey
		if strings.HasPrefix(tok, store.KindAccessToken.Prefix()) {
			k = store.KindAccessToken
		}
		if !ok || h.isBootstrap(tok) || !strings.HasPrefix(tok, k.Prefix()) {
			return r, none, nil
		}
		c, err := h.lookup(r.Context(), k, tok)
		if err == nil && c.p.Auditor {
			err = errAuditorOnly // an auditor reaches no sandbox
		}
		if err != nil {
			return r, none, err
		}
		r, stop := h.withCaller(r, c)
		return r, stop, nil
	}
	c, err := h.credential(r)
	if err == nil && c.p.Auditor {
		err = errAuditorOnly
	}
	if err != nil {
		return r, none, err
	}
	r, stop := h.withCaller(r, c)
	return r, stop, nil
}

// cutPrefixFold is strings.CutPrefix with an ASCII case-insensitive prefix.
func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return s, false
	}
	return s[len(prefix):], true
}

// newPortProxy makes the proxy to sandbox ports other than the agent's.
func (h *handler) newPortProxy() *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			id, rest, _ := strings.Cut(strings.TrimSuffix(host, hostSuffix), "-")
			portText, _, _ := strings.Cut(rest, "-")
			port, err := strconv.ParseUint(portText, 10, 16)
			if err != nil {
				return nil, fmt.Errorf("dialing sandbox %s: bad port %q", id, portText)
			}
			// Through the sandbox's fence, which the network side owns.
			return h.net.DialPort(ctx, id, uint16(port))
		},
		MaxIdleConnsPerHost: 16,
		MaxIdleConns:        maxIdleConns,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			st := pr.In.Context().Value(proxyStateKey{}).(*proxyState)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = proxyHost(st.id, st.port, st.inc)
			// The sandbox's server sees the Host the client used, unless
			// the sandbox asked for another (maskRequestHost).
			pr.Out.Host = pr.In.Host
			if st.mask != "" {
				pr.Out.Host = strings.ReplaceAll(st.mask, "${PORT}", strconv.Itoa(st.port))
			}
			h.stripCredentials(pr.Out.Header)
			pr.SetXForwarded()
		},
		Transport:     tr,
		FlushInterval: -1,
	}
	p.ErrorHandler = h.proxyErrorHandler(func(w http.ResponseWriter, r *http.Request, st *proxyState, err error) {
		// E2B answers 502 when nothing listens on the port.
		writeJSON(w, http.StatusBadGateway, api.ProxyError{SandboxID: st.id,
			Message: fmt.Sprintf("The sandbox is running but port is not open: %d", st.port), Code: http.StatusBadGateway})
	})
	return p
}

// proxyErrorHandler answers a request the proxy could not forward: the
// E2B 502 for a sandbox that is gone, nothing for a client that left, and
// unreachable's answer otherwise.
func (h *handler) proxyErrorHandler(unreachable func(http.ResponseWriter, *http.Request, *proxyState, error)) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		st := r.Context().Value(proxyStateKey{}).(*proxyState)
		st.errHandled.Store(true)
		if _, _, ok := h.running(st.id); !ok || st.killed.Load() || errors.Is(err, isolation.ErrNotFound) {
			writeNotFound(w, st.id, msgSandboxNotFound)
			return
		}
		if r.Context().Err() != nil {
			return // the client went away; nobody reads an answer
		}
		unreachable(w, r, st, err)
	}
}

// trackingWriter records whether the response has started. It unwraps for
// http.ResponseController, so flushing still works.
type trackingWriter struct {
	http.ResponseWriter
	wroteHeader bool
}

func (w *trackingWriter) WriteHeader(code int) {
	w.wroteHeader = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *trackingWriter) Write(b []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

func (w *trackingWriter) Flush() {
	w.wroteHeader = true
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *trackingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// serveSignedFiles serves a signed /files URL that names no sandbox: with
// E2B_SANDBOX_URL set, the SDKs' uploadUrl()/downloadUrl() carry neither the
// routing headers nor a per-sandbox host. The API key is
// not needed: the signature is the credential, and the sandbox is the one
// whose token it verifies for.
//
// A signature seen before is found in the signature index: one sandbox is
// looked up and checked. A new one is matched against the running
// sandboxes' tokens in memory (one SHA-256 each; at most maxSignatureScans
// requests do this at once: half the CPUs), after a malformed one is
// refused outright.
func (h *handler) serveSignedFiles(w http.ResponseWriter, r *http.Request) {
	op := "read"
	switch r.Method {
	case http.MethodGet:
	case http.MethodPost:
		op = "write"
	default:
		writeError(w, r, h.log, errorf(errMethodNotAllowed, "method %s is not allowed on /files", r.Method))
		return
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	refuse := func(err error) { writeError(w, r, h.log, errorf(errUnauthenticated, "%s", err.Error())) }
	if !wellFormedSignature(sig) {
		refuse(errInvalidSignature)
		return
	}
	now := h.now()
	if id, ok := h.signatures.get(sig); ok {
		if _, info, ok := h.running(id); ok && info.EnvdAccessToken != "" {
			switch err := checkSignature(q, op, info.EnvdAccessToken, now); {
			case err == nil:
				h.serveSigned(w, r, id)
				return
			case errors.Is(err, errExpiredSignature):
				refuse(err)
				return
			}
		}
		h.signatures.remove(sig)
	}
	sr, err := parseSigned(q, op)
	if err != nil {
		refuse(err)
		return
	}
	select {
	case h.scans <- struct{}{}:
	case <-r.Context().Done():
		return
	}
	var found error
	id, ok := h.m.MatchToken(func(token string) bool {
		found = sr.check(token, now)
		return found == nil || errors.Is(found, errExpiredSignature)
	})
	<-h.scans
	switch {
	case !ok:
		refuse(errInvalidSignature)
	case found != nil:
		refuse(found)
	default:
		h.signatures.add(sig, id)
		h.serveSigned(w, r, id)
	}
}

func (h *handler) serveSigned(w http.ResponseWriter, r *http.Request, id string) {
	if r.Header.Get(api.HeaderSignatureProbe) != "" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	h.serveSandbox(w, r, target{id: id, port: api.EnvdPort})
}
