package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

// Bounds of one intercepted connection.
const (
	// MaxHeaderBytes bounds a request's (and an upstream response's) header.
	MaxHeaderBytes = 64 << 10
	// MaxStreams bounds the concurrent HTTP/2 streams of one connection.
	MaxStreams = 64
	// maxUpstreamConns bounds the upstream connections one intercepted
	// connection opens (HTTP/1.1 upstreams need one per request in flight).
	maxUpstreamConns  = 16
	handshakeTimeout  = 10 * time.Second
	readHeaderTimeout = 30 * time.Second
	idleTimeout       = 2 * time.Minute
)

// Options configure a [Gateway].
type Options struct {
	// CA signs the certificates the gateway shows sandboxes. Required.
	CA *CA
	// Roots verify upstream servers; nil means the system roots.
	Roots *x509.CertPool
	// Secrets resolves secret names; nil resolves none (a request that
	// needs a secret is refused).
	Secrets Secrets
	// Recorder receives events and downloads; nil drops them.
	Recorder Recorder
	// Logger logs what the gateway does (never a secret's value); nil
	// discards.
	Logger *slog.Logger
}

// Gateway intercepts the flows of many sandboxes. It holds no per-flow
// state; [Gateway.ForSandbox] gives each sandbox its interceptor.
type Gateway struct {
	ca      *CA
	roots   *x509.CertPool
	secrets Secrets
	rec     Recorder
	log     *slog.Logger
	bufs    sync.Pool
}

// New makes a gateway.
func New(opts Options) (*Gateway, error) {
	if opts.CA == nil {
		return nil, errors.New("gateway: no CA")
	}
	g := &Gateway{ca: opts.CA, roots: opts.Roots, secrets: opts.Secrets, rec: opts.Recorder, log: opts.Logger}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	g.bufs.New = func() any { b := make([]byte, streamChunk); return &b }
	return g, nil
}

// ForSandbox returns the interceptor for sandbox id. cfg is called for
// every decision and every request, so it must be cheap and safe for
// concurrent use; a nil *Config (or one without a Policy) intercepts
// nothing and refuses every request.
func (g *Gateway) ForSandbox(id string, cfg func() *Config) egress.Interceptor {
	return &sandbox{g: g, id: id, cfg: cfg, log: g.log.With("sandbox", id), redirects: newRedirectMemo()}
}

// sandbox is one sandbox's interceptor.
type sandbox struct {
	g         *Gateway
	id        string
	cfg       func() *Config
	log       *slog.Logger
	redirects *redirectMemo
}

// InterceptTLS reports whether the gateway terminates a TLS flow for sni:
// never for a Passthrough name; otherwise under Inspect, whenever the
// sandbox has bindings (a placeholder sent to any host must be seen), for
// hosts with header rules, and for package registries (downloads are
// recorded).
func (s *sandbox) InterceptTLS(sni string) bool {
	c := s.cfg()
	name, ok := policy.NormalizeName(sni)
	if c == nil || c.Policy == nil || !ok {
		return false
	}
	if matchAny(c.Passthrough, name) {
		return false
	}
	return c.Inspect || len(c.Bindings) > 0 || ruleFor(c.Rules, name) != nil || policy.PresetOf(name) != ""
}

// InterceptHTTP reports whether a plain-HTTP flow whose first request
// names host goes through the gateway: when the sandbox has bindings or
// inspects, and for hosts with header rules and package registries;
// never for a Passthrough name.
func (s *sandbox) InterceptHTTP(host string) bool {
	c := s.cfg()
	if c == nil || c.Policy == nil {
		return false
	}
	name, _, ok := splitHost(host)
	if !ok {
		return len(c.Bindings) > 0 || c.Inspect
	}
	if matchAny(c.Passthrough, name) {
		return false
	}
	return c.Inspect || len(c.Bindings) > 0 || ruleFor(c.Rules, name) != nil || policy.PresetOf(name) != ""
}

// Serve terminates (for TLS) and serves one intercepted flow until either
// side ends it or ctx is done. out and in count the bytes read from and
// written to the sandbox's connection (TLS records included). Before it
// returns, Serve closes f.Conn, f.Upstream (used or not) and every
// upstream connection it dialed, and waits for its requests' handlers, so
// their events are recorded.
func (s *sandbox) Serve(ctx context.Context, f egress.InterceptedFlow) (out, in int64) {
	cc := &countConn{Conn: f.Conn, closed: make(chan struct{})}
	fc := &flowConn{sb: s, flow: f, first: f.Upstream, conns: map[net.Conn]struct{}{}, idle: make(chan struct{})}
	fc.ctx, fc.cancel = context.WithCancel(ctx)
	defer func() {
		fc.shutdown()
		cc.Close()
		out, in = cc.read.Load(), cc.written.Load()
	}()

	var conn net.Conn = cc
	if f.SNI != "" {
		sni, ok := policy.NormalizeName(f.SNI)
		if !ok {
			s.log.Debug("gateway: bad SNI", "sni", f.SNI)
			return
		}
		fc.sni = sni
		tc := tls.Server(cc, &tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"h2", "http/1.1"},
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				return s.g.ca.Leaf(sni)
			},
		})
		hctx, cancel := context.WithTimeout(fc.ctx, handshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			s.log.Debug("gateway: TLS handshake with the sandbox failed", "sni", sni, "err", err)
			return
		}
		conn = tc
		fc.target = net.JoinHostPort(sni, strconv.Itoa(int(f.Dst.Port())))
	} else {
		fc.target = f.Dst.String()
	}
	fc.setup()

	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(f.SNI != "")
	srv := &http.Server{
		Handler:           fc,
		Protocols:         &protos,
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return fc.ctx },
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:      MaxStreams,
			MaxDecoderHeaderTableSize: 16 << 10,
			MaxEncoderHeaderTableSize: 16 << 10,
		},
	}
	stop := context.AfterFunc(fc.ctx, func() { cc.Close() })
	defer stop()
	srv.Serve(&oneConnListener{conn: conn, closed: cc.closed})
	srv.Close()
	return
}

// countConn counts the sandbox side's bytes and signals its close.
type countConn struct {
	net.Conn
	read, written atomic.Int64
	closeOnce     sync.Once
	closed        chan struct{}
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

func (c *countConn) Close() error {
	err := net.ErrClosed
	c.closeOnce.Do(func() {
		err = c.Conn.Close()
		close(c.closed)
	})
	return err
}

// oneConnListener yields one connection, then blocks until it is closed.
type oneConnListener struct {
	conn   net.Conn
	closed <-chan struct{}
	taken  atomic.Bool
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	if l.taken.CompareAndSwap(false, true) {
		return l.conn, nil
	}
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }

// flowConn is one intercepted connection: its upstream transports and the
// requests in flight on it.
type flowConn struct {
	sb     *sandbox
	flow   egress.InterceptedFlow
	sni    string // "" for plain HTTP
	target string // the upstream URL host: SNI:port, or Dst for plain HTTP
	ctx    context.Context
	cancel context.CancelFunc

	tr, tr1 *http.Transport // tr1 speaks HTTP/1.1 only, for upgrades
	proxy   *httputil.ReverseProxy

	mu       sync.Mutex
	first    net.Conn // f.Upstream until a dial takes it
	conns    map[net.Conn]struct{}
	closed   bool
	inflight int
	idle     chan struct{} // closed when closed && inflight == 0
}

func (fc *flowConn) setup() {
	newTransport := func(protos []string) *http.Transport {
		t := &http.Transport{
			DisableCompression:     true,
			MaxIdleConnsPerHost:    4,
			MaxConnsPerHost:        maxUpstreamConns,
			IdleConnTimeout:        idleTimeout,
			MaxResponseHeaderBytes: MaxHeaderBytes,
			ExpectContinueTimeout:  time.Second,
		}
		if fc.sni != "" {
			t.DialTLSContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				return fc.dialTLS(ctx, protos)
			}
			t.ForceAttemptHTTP2 = len(protos) > 1
		} else {
			t.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				return fc.dial(ctx)
			}
		}
		return t
	}
	fc.tr = newTransport([]string{"h2", "http/1.1"})
	fc.tr1 = newTransport([]string{"http/1.1"})
	fc.proxy = &httputil.ReverseProxy{
		Rewrite:        fc.rewrite,
		Transport:      roundTripperFunc(fc.roundTrip),
		ModifyResponse: fc.modifyResponse,
		ErrorHandler:   fc.proxyError,
		ErrorLog:       slog.NewLogLogger(fc.sb.log.Handler(), slog.LevelDebug),
		BufferPool:     (*bufferPool)(&fc.sb.g.bufs),
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (fc *flowConn) roundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get("Upgrade") != "" {
		return fc.tr1.RoundTrip(r)
	}
	return fc.tr.RoundTrip(r)
}

type bufferPool sync.Pool

func (p *bufferPool) Get() []byte  { return *(*sync.Pool)(p).Get().(*[]byte) }
func (p *bufferPool) Put(b []byte) { (*sync.Pool)(p).Put(&b) }

var errFlowClosed = errors.New("gateway: intercepted connection closed")

// dial returns the flow's first upstream connection, then new ones to
// Dst; every one is closed when the intercepted connection ends.
func (fc *flowConn) dial(ctx context.Context) (net.Conn, error) {
	fc.mu.Lock()
	if fc.closed {
		fc.mu.Unlock()
		return nil, errFlowClosed
	}
	c := fc.first
	fc.first = nil
	fc.mu.Unlock()
	if c == nil {
		if fc.flow.Dial == nil {
			return nil, errors.New("gateway: no dialer for a second upstream connection")
		}
		var err error
		if c, err = fc.flow.Dial(ctx); err != nil {
			return nil, fmt.Errorf("gateway: dialing %v: %w", fc.flow.Dst, err)
		}
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.closed {
		c.Close()
		return nil, errFlowClosed
	}
	fc.conns[c] = struct{}{}
	return &trackedConn{Conn: c, fc: fc}, nil
}

func (fc *flowConn) dialTLS(ctx context.Context, protos []string) (net.Conn, error) {
	raw, err := fc.dial(ctx)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(raw, &tls.Config{
		ServerName: fc.sni,
		RootCAs:    fc.sb.g.roots,
		NextProtos: protos,
		MinVersion: tls.VersionTLS12,
	})
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("gateway: TLS to %s at %v: %w", fc.sni, fc.flow.Dst, err)
	}
	return tc, nil
}

type trackedConn struct {
	net.Conn
	fc   *flowConn
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.fc.mu.Lock()
		delete(c.fc.conns, c.Conn)
		c.fc.mu.Unlock()
	})
	return c.Conn.Close()
}

// enter admits a request; false once the connection is shutting down.
func (fc *flowConn) enter() bool {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.closed {
		return false
	}
	fc.inflight++
	return true
}

func (fc *flowConn) leave() {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.inflight--; fc.inflight == 0 && fc.closed {
		close(fc.idle)
	}
}

// shutdown cancels the requests in flight, closes every upstream
// connection and waits for the handlers to return (so their events are
// recorded before Serve returns).
func (fc *flowConn) shutdown() {
	fc.cancel()
	fc.mu.Lock()
	fc.closed = true
	if fc.first != nil {
		fc.first.Close()
		fc.first = nil
	}
	conns := make([]net.Conn, 0, len(fc.conns))
	for c := range fc.conns {
		conns = append(conns, c)
	}
	n := fc.inflight
	if n == 0 {
		close(fc.idle)
	}
	fc.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	if fc.tr != nil {
		fc.tr.CloseIdleConnections()
		fc.tr1.CloseIdleConnections()
	}
	<-fc.idle
}
