package mcp

import (
	"context"
	"crypto/subtle"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// SessionIdle is how long an HTTP session may go without a request before
// it is closed.
const SessionIdle = 30 * time.Minute

// NewHTTPHandler serves the tools as MCP's streamable HTTP transport. A
// session's tools use the client clientFor returns for the API key
// (X-API-Key) of the request that opened it, and a later request of the
// session that carries another key is refused. Authenticating the keys is
// the caller's: the handler answers whoever reaches it.
func NewHTTPHandler(clientFor func(apiKey string) *client.Client) http.Handler {
	return newHTTPHandler(clientFor, false)
}

func newHTTPHandler(clientFor func(apiKey string) *client.Client, stateless bool) http.Handler {
	return sdk.NewStreamableHTTPHandler(func(r *http.Request) *sdk.Server {
		key := r.Header.Get(api.HeaderAPIKey)
		s := NewServer(clientFor(key))
		s.AddReceivingMiddleware(sameKey(key))
		return s
	}, &sdk.StreamableHTTPOptions{
		SessionTimeout: SessionIdle,
		Stateless:      stateless,
		// Every request carries the API key, which a page that rebound a
		// name to 127.0.0.1 cannot send: the check would only refuse
		// the daemon behind a local reverse proxy.
		DisableLocalhostProtection: true,
	})
}

// errOtherKey refuses a request of a session opened with another API key.
var errOtherKey = errors.New("this MCP session was opened with another API key")

// sameKey refuses the requests and notifications of a session that come
// with another API key than key, the one that opened it.
func sameKey(key string) sdk.Middleware {
	return func(next sdk.MethodHandler) sdk.MethodHandler {
		return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
			if extra := req.GetExtra(); extra != nil && extra.Header != nil &&
				subtle.ConstantTimeCompare([]byte(extra.Header.Get(api.HeaderAPIKey)), []byte(key)) != 1 {
				return nil, errOtherKey
			}
			return next(ctx, method, req)
		}
	}
}

// DaemonHandler is the daemon's /mcp handler: sessions reach the API that
// h returns (read at each connection, so it may be set after this call)
// in-process, with the API key of the request that opened them. stop
// closes the in-process connections.
func DaemonHandler(h func() http.Handler) (handler http.Handler, stop func()) {
	hc, stop := Loopback(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h().ServeHTTP(w, r) }))
	return NewHTTPHandler(func(key string) *client.Client {
		return client.New("http://fence-loopback", key, client.WithHTTPClient(hc))
	}), stop
}

// ClusterHandler is `fence router`'s /mcp handler. Its tools reach the
// API h serves (the router's own, so they see and place sandboxes on
// every node of the cluster) in-process, with the API key of each
// request. It is stateless: no session outlives its request (MCP's
// sessionless mode; GET and DELETE answer 405), so any router of a
// cluster answers any request, and a router that restarts loses nothing.
// stop closes the in-process connections.
func ClusterHandler(h http.Handler) (handler http.Handler, stop func()) {
	hc, stop := Loopback(h)
	return newHTTPHandler(func(key string) *client.Client {
		return client.New("http://fence-loopback", key, client.WithHTTPClient(hc))
	}, true), stop
}

// Loopback returns an HTTP client whose requests h serves in this process,
// over in-memory connections, with the streaming of a real connection
// (envd's process streams flush as they go). The URL's host is ignored.
// Close stops the server and its connections.
func Loopback(h http.Handler) (hc *http.Client, closeFn func()) {
	ln := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
	var once sync.Once
	start := func() { go func() { _ = srv.Serve(ln) }() }
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			once.Do(start)
			return ln.dial(ctx)
		},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     time.Minute,
	}
	return &http.Client{Transport: tr}, func() {
		tr.CloseIdleConnections()
		_ = srv.Close()
		ln.close()
	}
}

// pipeListener hands the server ends of net.Pipe pairs to an http.Server.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

var errClosed = errors.New("mcp: loopback closed")

func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.done:
		return nil, errClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) close() { l.once.Do(func() { close(l.done) }) }

func (l *pipeListener) Close() error { l.close(); return nil }

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "fence-loopback" }
