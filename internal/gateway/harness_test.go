package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/egress/sniff"
)

// The harness plays the egress stack: a loopback listener stands for the
// sandbox's side; each accepted connection is sniffed (SNI or Host) and
// either handed to the gateway as an InterceptedFlow or relayed untouched,
// like the stack does. Upstream is one real TLS server (and one plain HTTP
// server) answering for every name with certificates from its own CA, which
// the gateway trusts through Options.Roots.

// fakeDst is the address the sandbox "connected to": public, so the policy
// judges it like a real one; the harness's dialers reach the loopback
// upstream servers instead.
var fakeDst = netip.MustParseAddrPort("93.184.215.14:443")

type memRecorder struct {
	mu        sync.Mutex
	events    []Event
	downloads []Download
}

func (m *memRecorder) Request(_ context.Context, ev Event) {
	m.mu.Lock()
	m.events = append(m.events, ev)
	m.mu.Unlock()
}

func (m *memRecorder) Download(_ context.Context, d Download) {
	m.mu.Lock()
	m.downloads = append(m.downloads, d)
	m.mu.Unlock()
}

// waitEvent waits for an event matching ok.
func (m *memRecorder) waitEvent(t testing.TB, ok func(Event) bool) Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		m.mu.Lock()
		for _, ev := range m.events {
			if ok(ev) {
				m.mu.Unlock()
				return ev
			}
		}
		m.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t.Fatalf("no matching event; have %+v", m.events)
	return Event{}
}

func (m *memRecorder) waitDownloads(t testing.TB, n int) []Download {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		m.mu.Lock()
		if len(m.downloads) >= n {
			d := append([]Download(nil), m.downloads...)
			m.mu.Unlock()
			return d
		}
		m.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t.Fatalf("want %d downloads, have %+v", n, m.downloads)
	return nil
}

type memSecrets struct {
	mu sync.Mutex
	m  map[string]string
}

func (s *memSecrets) Value(_ context.Context, name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[name]
	if !ok {
		return "", fmt.Errorf("no secret %q", name)
	}
	return v, nil
}

func (s *memSecrets) set(name, v string) {
	s.mu.Lock()
	s.m[name] = v
	s.mu.Unlock()
}

// seenRequest is what upstream received.
type seenRequest struct {
	Host   string
	Proto  string
	URI    string
	Header http.Header
	Body   []byte
}

type harness struct {
	t       testing.TB
	ca      *CA
	gw      *Gateway
	rec     *memRecorder
	secrets *memSecrets
	cfg     atomic.Pointer[Config]
	ic      egress.Interceptor
	ln      net.Listener

	upTLS, upHTTP *httptest.Server
	upRoots       *x509.CertPool
	upMu          sync.Mutex
	seen          []seenRequest
	handler       http.Handler

	// dstPort, when set, is the port the sandbox's TLS flows "connected
	// to" (443 otherwise).
	dstPort atomic.Uint32

	passthrough atomic.Int64
	served      atomic.Int64
	finished    atomic.Int64 // Serve calls returned
	upOpen      atomic.Int64 // upstream TLS connections open
	wg          sync.WaitGroup
}

func newCAForTest(t testing.TB) *CA {
	t.Helper()
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// allowAll compiles an allow-all policy.
func allowAll(t testing.TB) *policy.Policy {
	p, err := policy.Compile(policy.Spec{AllowAll: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func allowNames(t testing.TB, names ...string) *policy.Policy {
	spec := policy.Spec{}
	for _, n := range names {
		r, err := policy.ParseTarget(n)
		if err != nil {
			t.Fatal(err)
		}
		spec.Allow = append(spec.Allow, r)
	}
	p, err := policy.Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newHarness(t testing.TB, cfg *Config) *harness {
	t.Helper()
	h := &harness{t: t, ca: newCAForTest(t), rec: &memRecorder{}, secrets: &memSecrets{m: map[string]string{}}}
	h.cfg.Store(cfg)
	upCA := newCAForTest(t)
	rogue := newCAForTest(t)
	roots := x509.NewCertPool()
	roots.AddCert(upCA.Certificate())
	h.upRoots = roots

	h.handler = http.HandlerFunc(echo)
	record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.upMu.Lock()
		h.seen = append(h.seen, seenRequest{Host: r.Host, Proto: r.Proto, URI: r.RequestURI, Header: r.Header.Clone(), Body: body})
		h.upMu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.handler.ServeHTTP(w, r)
	})
	h.upTLS = httptest.NewUnstartedServer(record)
	h.upTLS.EnableHTTP2 = true
	h.upTLS.TLS = &tls.Config{GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		if strings.HasPrefix(hello.ServerName, "untrusted.") {
			return rogue.Leaf(hello.ServerName)
		}
		return upCA.Leaf(hello.ServerName)
	}}
	h.upTLS.Config.ConnState = func(_ net.Conn, cs http.ConnState) {
		switch cs {
		case http.StateNew:
			h.upOpen.Add(1)
		case http.StateClosed, http.StateHijacked:
			h.upOpen.Add(-1)
		}
	}
	h.upTLS.StartTLS()
	t.Cleanup(h.upTLS.Close)
	h.upHTTP = httptest.NewServer(record)
	t.Cleanup(h.upHTTP.Close)

	gw, err := New(Options{CA: h.ca, Roots: roots, Secrets: h.secrets, Recorder: h.rec})
	if err != nil {
		t.Fatal(err)
	}
	h.gw = gw
	h.ic = gw.ForSandbox("sbx-test", h.cfg.Load)

	h.ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		h.ln.Close()
		cancel()
		h.wg.Wait()
	})
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for {
			c, err := h.ln.Accept()
			if err != nil {
				return
			}
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				h.stack(ctx, c)
			}()
		}
	}()
	return h
}

// stack sniffs one sandbox connection and intercepts or relays it.
func (h *harness) stack(ctx context.Context, c net.Conn) {
	defer c.Close()
	var buf []byte
	var res sniff.Result
	tmp := make([]byte, 4096)
	for {
		n, err := c.Read(tmp)
		if err != nil {
			return
		}
		buf = append(buf, tmp[:n]...)
		r, err := sniff.Sniff(buf)
		if errors.Is(err, sniff.ErrNeedMore) {
			continue
		}
		if err != nil {
			return
		}
		res = r
		break
	}
	up := h.upTLS.Listener.Addr().String()
	if res.Kind == sniff.HTTP {
		up = h.upHTTP.Listener.Addr().String()
	}
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", up)
	}
	name, _ := policy.NormalizeName(res.Name)
	sandboxSide := &prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(buf), c)}
	intercept := false
	switch res.Kind {
	case sniff.TLS:
		intercept = h.ic.InterceptTLS(name)
	case sniff.HTTP:
		intercept = h.ic.InterceptHTTP(res.Name)
	}
	if !intercept {
		h.passthrough.Add(1)
		u, err := dial(ctx)
		if err != nil {
			return
		}
		defer u.Close()
		go func() { io.Copy(u, sandboxSide); u.(*net.TCPConn).CloseWrite() }()
		io.Copy(c, u)
		return
	}
	h.served.Add(1)
	u, err := dial(ctx)
	if err != nil {
		return
	}
	sni := ""
	dst := fakeDst
	if res.Kind == sniff.TLS {
		sni = name
		if p := h.dstPort.Load(); p != 0 {
			dst = netip.AddrPortFrom(fakeDst.Addr(), uint16(p))
		}
	} else {
		dst = netip.AddrPortFrom(fakeDst.Addr(), 80)
	}
	h.ic.Serve(ctx, egress.InterceptedFlow{Conn: sandboxSide, Upstream: u, Dial: dial, Dst: dst, Names: []string{name}, SNI: sni})
	h.finished.Add(1)
}

type prefixConn struct {
	net.Conn
	r io.Reader
}

func (p *prefixConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// client returns an HTTP client that reaches every host through the
// harness, trusting the gateway's CA; proto is "h1" or "h2".
func (h *harness) client(proto string) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.ca.CertPEM())
	return h.clientTrusting(proto, pool)
}

func (h *harness) clientTrusting(proto string, pool *x509.CertPool) *http.Client {
	var protos http.Protocols
	protos.SetHTTP1(proto == "h1")
	protos.SetHTTP2(proto == "h2")
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", h.ln.Addr().String())
		},
		TLSClientConfig:    &tls.Config{RootCAs: pool},
		ForceAttemptHTTP2:  proto == "h2",
		Protocols:          &protos,
		DisableCompression: true,
	}
	h.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func (h *harness) seenRequests() []seenRequest {
	h.upMu.Lock()
	defer h.upMu.Unlock()
	return append([]seenRequest(nil), h.seen...)
}

func (h *harness) seenHost(host string) []seenRequest {
	var out []seenRequest
	for _, s := range h.seenRequests() {
		if sh, _, _ := splitHost(s.Host); sh == host {
			out = append(out, s)
		}
	}
	return out
}

// echo answers with what it received: every request header as
// "Name: value" lines, the query and the body; it also echoes the
// Authorization header in a response header.
func echo(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasPrefix(r.URL.Path, "/redirect"):
		w.Header().Set("Location", r.URL.Query().Get("to"))
		w.WriteHeader(http.StatusFound)
		return
	case strings.HasPrefix(r.URL.Path, "/artifact/"), isArtifactPath(r):
		w.Write(artifactBody(r.Host + r.URL.Path))
		return
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "proto=%s host=%s uri=%s\n", r.Proto, r.Host, r.RequestURI)
	for k, vs := range r.Header {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	body, _ := io.ReadAll(r.Body)
	b.Write(body)
	w.Header().Set("X-Echo-Authorization", r.Header.Get("Authorization"))
	w.Header().Set("X-Echo-Query", r.URL.RawQuery)
	w.Header().Set("X-Echo-Accept-Encoding", r.Header.Get("Accept-Encoding"))
	w.Write(b.Bytes())
}

func isArtifactPath(r *http.Request) bool {
	_, ok := artifactOf(strings.Split(r.Host, ":")[0], r.URL.EscapedPath())
	return ok || strings.HasPrefix(r.URL.Path, "/asset/")
}

// artifactBody is deterministic content of a few hundred KiB.
func artifactBody(key string) []byte {
	seed := sha256.Sum256([]byte(key))
	out := make([]byte, 0, 300<<10)
	for len(out) < 300<<10 {
		seed = sha256.Sum256(seed[:])
		out = append(out, seed[:]...)
	}
	return out
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func get(t testing.TB, c *http.Client, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp, string(b)
}

// egressFlow is a flow for Serve on conn c, to the harness's TLS upstream.
func egressFlow(c net.Conn, h *harness) egress.InterceptedFlow {
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", h.upTLS.Listener.Addr().String())
	}
	u, _ := dial(context.Background())
	return egress.InterceptedFlow{Conn: c, Upstream: u, Dial: dial, Dst: fakeDst, Names: []string{"api.test"}, SNI: "api.test"}
}

// useH1Upstream replaces the TLS upstream with one that offers only
// HTTP/1.1 (same certificates, same handler).
func (h *harness) useH1Upstream() {
	old := h.upTLS
	srv := httptest.NewUnstartedServer(old.Config.Handler)
	srv.TLS = &tls.Config{GetCertificate: old.TLS.GetCertificate, NextProtos: []string{"http/1.1"}}
	srv.StartTLS()
	h.t.Cleanup(srv.Close)
	h.upTLS = srv
}
