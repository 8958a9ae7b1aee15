package egress_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

// socksServer is a minimal RFC 1928/1929 SOCKS5 server (CONNECT only)
// that records every request and connects to target(port).
type socksServer struct {
	l          net.Listener
	user, pass string // credentials required when user is set
	target     func(port uint16) string
	mu         sync.Mutex
	reqs       []string // "ip 203.0.113.10:80", "name allowed.test:80"
	auths      []string // "user:pass" as offered
	conns      int
}

func newSOCKSServer(t *testing.T, user, pass string, target func(port uint16) string) *socksServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &socksServer{l: l, user: user, pass: pass, target: target}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns++
			s.mu.Unlock()
			go s.serve(c)
		}
	}()
	return s
}

func (s *socksServer) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

func (s *socksServer) serve(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var h [2]byte
	if _, err := io.ReadFull(c, h[:]); err != nil || h[0] != 5 {
		return
	}
	methods := make([]byte, h[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return
	}
	want := byte(0)
	if s.user != "" {
		want = 2
	}
	if !slices.Contains(methods, want) {
		c.Write([]byte{5, 0xff})
		return
	}
	c.Write([]byte{5, want})
	if want == 2 {
		var v [2]byte
		if _, err := io.ReadFull(c, v[:]); err != nil || v[0] != 1 {
			return
		}
		user := make([]byte, v[1])
		io.ReadFull(c, user)
		var pl [1]byte
		io.ReadFull(c, pl[:])
		pass := make([]byte, pl[0])
		io.ReadFull(c, pass)
		s.mu.Lock()
		s.auths = append(s.auths, string(user)+":"+string(pass))
		s.mu.Unlock()
		if string(user) != s.user || string(pass) != s.pass {
			c.Write([]byte{1, 1})
			return
		}
		c.Write([]byte{1, 0})
	}
	var req [4]byte
	if _, err := io.ReadFull(c, req[:]); err != nil || req[0] != 5 || req[1] != 1 {
		return
	}
	var host, kind string
	switch req[3] {
	case 1, 4:
		b := make([]byte, map[byte]int{1: 4, 4: 16}[req[3]])
		io.ReadFull(c, b)
		a, _ := netip.AddrFromSlice(b)
		host, kind = a.String(), "ip"
	case 3:
		var l [1]byte
		io.ReadFull(c, l[:])
		b := make([]byte, l[0])
		io.ReadFull(c, b)
		host, kind = string(b), "name"
	default:
		return
	}
	var pb [2]byte
	if _, err := io.ReadFull(c, pb[:]); err != nil {
		return
	}
	port := binary.BigEndian.Uint16(pb[:])
	s.mu.Lock()
	s.reqs = append(s.reqs, kind+" "+net.JoinHostPort(host, strconv.Itoa(int(port))))
	s.mu.Unlock()
	up, err := net.Dial("tcp", s.target(port))
	if err != nil {
		c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		return
	}
	defer up.Close()
	c.Write([]byte{5, 0, 0, 1, 127, 0, 0, 1, 0x12, 0x34})
	c.SetDeadline(time.Time{})
	go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite() }()
	io.Copy(c, up)
}

// proxyEnv is an egress env whose direct dials are recorded (the oracle:
// with a proxy set, none may reach an upstream) and whose proxy address
// is dialed for real.
func proxyEnv(t *testing.T, spec policy.Spec, proxy func(e *envHolder) *egress.Proxy) (*env, *envHolder) {
	h := &envHolder{}
	e := newEnv(t, spec, func(o *egress.Options) {
		o.ConnectTimeout = 2 * time.Second
		inner := o.Dial
		o.Dial = func(ctx context.Context, network, address string) (net.Conn, error) {
			if h.proxyAddr != "" && address == h.proxyAddr {
				h.mu.Lock()
				h.proxyDials++
				h.mu.Unlock()
				var d net.Dialer
				return d.DialContext(ctx, network, address)
			}
			return inner(ctx, network, address)
		}
	})
	h.e = e
	if proxy != nil {
		p := proxy(h)
		h.proxyAddr = p.Address
		e.st.SetProxy(p)
	}
	return e, h
}

type envHolder struct {
	e          *env
	proxyAddr  string
	mu         sync.Mutex
	proxyDials int
}

func (e *env) upstreamTarget(port uint16) string {
	if u := e.ups[port]; u != nil {
		return u.l.Addr().String()
	}
	return "127.0.0.1:1"
}

func upstreamConns(e *env) int {
	n := 0
	for _, u := range e.ups {
		n += len(u.received())
	}
	return n
}

var allowAllSpec = policy.Spec{AllowAll: true}

func TestProxyByAddress(t *testing.T) {
	var srv *socksServer
	e, h := proxyEnv(t, allowAllSpec, func(h *envHolder) *egress.Proxy {
		srv = newSOCKSServer(t, "", "", func(p uint16) string { return h.e.upstreamTarget(p) })
		return &egress.Proxy{Address: srv.l.Addr().String()}
	})
	got, err := e.get(t, ap("203.0.113.10:80"), "allowed.test")
	if err != nil || got != "hello allowed.test" {
		t.Fatalf("GET through the proxy = %q, %v", got, err)
	}
	if reqs := srv.requests(); !slices.Equal(reqs, []string{"ip 203.0.113.10:80"}) {
		t.Errorf("proxy requests = %v, want [ip 203.0.113.10:80]", reqs)
	}
	if d := e.dialed(); len(d) != 0 {
		t.Errorf("direct dials = %v, want none", d)
	}
	// IPv6 destinations go as ATYP 4.
	if _, err := e.get(t, ap("[2001:db8::10]:80"), "allowed.test"); err != nil {
		t.Errorf("GET [2001:db8::10] through the proxy: %v", err)
	}
	if reqs := srv.requests(); len(reqs) != 2 || reqs[1] != "ip [2001:db8::10]:80" {
		t.Errorf("proxy requests = %v, want the IPv6 one second", reqs)
	}
	// Without the proxy the stack connects directly again.
	e.st.SetProxy(nil)
	if _, err := e.get(t, ap("203.0.113.10:80"), "allowed.test"); err != nil {
		t.Errorf("GET without proxy: %v", err)
	}
	if d := e.dialed(); !slices.Equal(d, []string{"203.0.113.10:80"}) {
		t.Errorf("direct dials after SetProxy(nil) = %v, want [203.0.113.10:80]", d)
	}
	_ = h
}

func TestProxyRemoteDNSForNames(t *testing.T) {
	var srv *socksServer
	e, _ := proxyEnv(t, allowList, func(h *envHolder) *egress.Proxy {
		srv = newSOCKSServer(t, "", "", func(p uint16) string { return h.e.upstreamTarget(p) })
		return &egress.Proxy{Address: srv.l.Addr().String()}
	})
	as := e.lookup(t, "allowed.test")
	if len(as) == 0 {
		t.Fatal("allowed.test does not resolve")
	}
	got, err := e.get(t, netip.AddrPortFrom(as[0], 80), "allowed.test")
	if err != nil || got != "hello allowed.test" {
		t.Fatalf("GET allowed.test through the proxy = %q, %v", got, err)
	}
	if reqs := srv.requests(); !slices.Equal(reqs, []string{"name allowed.test:80"}) {
		t.Errorf("proxy requests = %v, want [name allowed.test:80] (ATYP domain)", reqs)
	}
	// The policy still applies before the proxy: a refused flow never
	// reaches it.
	if _, err := e.get(t, ap("203.0.113.66:80"), "evil.test"); err == nil {
		t.Errorf("GET evil.test through the proxy succeeded")
	}
	if reqs := srv.requests(); len(reqs) != 1 {
		t.Errorf("proxy requests after a refused flow = %v, want only the first", reqs)
	}
	if d := e.dialed(); len(d) != 0 {
		t.Errorf("direct dials = %v, want none", d)
	}
}

func TestProxyAuth(t *testing.T) {
	var srv *socksServer
	e, _ := proxyEnv(t, allowAllSpec, func(h *envHolder) *egress.Proxy {
		srv = newSOCKSServer(t, "alice", "s3cret", func(p uint16) string { return h.e.upstreamTarget(p) })
		return &egress.Proxy{Address: srv.l.Addr().String(), Username: "alice", Password: "s3cret"}
	})
	if got, err := e.get(t, ap("203.0.113.10:80"), "allowed.test"); err != nil || got != "hello allowed.test" {
		t.Fatalf("GET with the right credentials = %q, %v", got, err)
	}
	// The upstream counts a connection once its handler returns, after the
	// client has its answer: wait for it.
	for deadline := time.Now().Add(5 * time.Second); upstreamConns(e) == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	before := upstreamConns(e)
	// Wrong password: the flow fails, nothing reaches any upstream.
	e.st.SetProxy(&egress.Proxy{Address: srv.l.Addr().String(), Username: "alice", Password: "wrong"})
	if _, err := e.get(t, ap("203.0.113.10:80"), "allowed.test"); err == nil {
		t.Errorf("GET with a wrong password succeeded")
	}
	// No credentials offered to a proxy that requires them.
	e.st.SetProxy(&egress.Proxy{Address: srv.l.Addr().String()})
	if _, err := e.get(t, ap("203.0.113.10:80"), "allowed.test"); err == nil {
		t.Errorf("GET without credentials succeeded")
	}
	time.Sleep(100 * time.Millisecond)
	if n := upstreamConns(e); n != before {
		t.Errorf("upstream connections = %d after refused proxy auth, want %d", n, before)
	}
	if d := e.dialed(); len(d) != 0 {
		t.Errorf("direct dials = %v, want none (fail closed)", d)
	}
	srv.mu.Lock()
	auths := slices.Clone(srv.auths)
	srv.mu.Unlock()
	if !slices.Equal(auths, []string{"alice:s3cret", "alice:wrong"}) {
		t.Errorf("auths seen = %v", auths)
	}
	var refused []egress.FlowEvent
	for _, ev := range e.waitEvents(t, "tcp", 3) {
		if !ev.Allowed {
			refused = append(refused, ev)
		}
	}
	if len(refused) != 2 {
		t.Errorf("refused flows = %+v, want 2", refused)
	}
	for _, ev := range refused {
		if ev.Reason != egress.ReasonDialFailed || !strings.Contains(ev.Err, "egress proxy") {
			t.Errorf("event of a refused proxy flow = %+v, want dial-failed with the proxy's error", ev)
		}
		if strings.Contains(ev.Err, "wrong") || strings.Contains(ev.Err, "s3cret") {
			t.Errorf("event error %q shows the password", ev.Err)
		}
	}
}

func TestProxyFailsClosed(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	// A server that does not speak SOCKS5.
	notSOCKS, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer notSOCKS.Close()
	go func() {
		for {
			c, err := notSOCKS.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 400 Bad Request\r\n\r\n")
			c.Close()
		}
	}()
	// A silent one: the handshake times out.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	var held []net.Conn
	var hmu sync.Mutex
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			hmu.Lock()
			held = append(held, c)
			hmu.Unlock()
		}
	}()
	defer func() {
		hmu.Lock()
		for _, c := range held {
			c.Close()
		}
		hmu.Unlock()
	}()
	e, h := proxyEnv(t, allowAllSpec, nil)
	for _, tc := range []struct {
		what string
		p    *egress.Proxy
		dial bool // the proxy is dialed
	}{
		{"down", &egress.Proxy{Address: deadAddr}, true},
		{"not SOCKS5", &egress.Proxy{Address: notSOCKS.Addr().String()}, true},
		{"silent", &egress.Proxy{Address: silent.Addr().String()}, true},
		{"internal address", &egress.Proxy{Address: notSOCKS.Addr().String(), Allowed: func(netip.Addr) bool { return false }}, false},
		{"unresolvable", &egress.Proxy{Address: "proxy.invalid:1080", Lookup: func(context.Context, string) ([]netip.Addr, error) {
			return nil, errors.New("no such host")
		}}, false},
	} {
		h.mu.Lock()
		h.proxyDials = 0
		h.mu.Unlock()
		h.proxyAddr = tc.p.Address
		e.st.SetProxy(tc.p)
		start := time.Now()
		if _, err := e.get(t, ap("203.0.113.10:80"), "allowed.test"); err == nil {
			t.Errorf("%s: GET through a broken proxy succeeded", tc.what)
		}
		t.Logf("%s: failed after %v", tc.what, time.Since(start))
		h.mu.Lock()
		if dialed := h.proxyDials > 0; dialed != tc.dial {
			t.Errorf("%s: proxy dialed = %v, want %v", tc.what, dialed, tc.dial)
		}
		h.mu.Unlock()
	}
	if d := e.dialed(); len(d) != 0 {
		t.Errorf("direct dials = %v, want none (fail closed)", d)
	}
	if n := upstreamConns(e); n != 0 {
		t.Errorf("upstream connections = %d, want 0", n)
	}
}

func TestProxyString(t *testing.T) {
	p := &egress.Proxy{Address: "proxy.example:1080", Username: "u", Password: "hunter2"}
	if s := p.String(); strings.Contains(s, "hunter2") {
		t.Errorf("String() = %q shows the password", s)
	}
}
