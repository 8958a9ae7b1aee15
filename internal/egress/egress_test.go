package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/egresstest"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

// upstream is a fake internet server on 127.0.0.1 that logs what each
// connection sent.
type upstream struct {
	l       net.Listener
	mu      sync.Mutex
	got     []string // bytes received per connection, at close
	handler func(c net.Conn, r *bufio.Reader)
}

func newUpstream(t testing.TB, h func(c net.Conn, r *bufio.Reader)) *upstream {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{l: l, handler: h}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				rec := &recordingReader{r: c}
				u.handler(c, bufio.NewReader(rec))
				u.mu.Lock()
				u.got = append(u.got, rec.buf.String())
				u.mu.Unlock()
			}()
		}
	}()
	return u
}

func (u *upstream) received() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.got)
}

type recordingReader struct {
	r   io.Reader
	buf strings.Builder
}

func (r *recordingReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if r.buf.Len() < 1<<16 {
		r.buf.Write(b[:n])
	}
	return n, err
}

// httpHandler answers one HTTP/1 request with "hello <Host>".
func httpHandler(c net.Conn, r *bufio.Reader) {
	req, err := http.ReadRequest(r)
	if err != nil {
		return
	}
	body := "hello " + req.Host
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// sinkHandler reads everything.
func sinkHandler(c net.Conn, r *bufio.Reader) { io.Copy(io.Discard, r) }

type env struct {
	st    *egress.Stack
	sb    *egresstest.Sandbox
	dns   *egresstest.DNSServer
	rec   *egresstest.Recorder
	ups   map[uint16]*upstream
	mu    sync.Mutex
	dials []string
}

func (e *env) dialed() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.dials)
}

var zone = map[string][]string{
	"allowed.test": {"203.0.113.10", "2001:db8::10"},
	"shared.test":  {"203.0.113.20"},
	"evil.test":    {"203.0.113.66"},
	"ssh.test":     {"203.0.113.22"},
	"rebind.test":  {"203.0.113.30"},
}

func newEnv(t testing.TB, spec policy.Spec, mod func(*egress.Options)) *env {
	t.Helper()
	e := &env{
		dns: egresstest.NewDNSServer(t, zone),
		rec: &egresstest.Recorder{},
		ups: map[uint16]*upstream{
			80:  newUpstream(t, httpHandler),
			443: newUpstream(t, sinkHandler),
			9:   newUpstream(t, sinkHandler),
			19: newUpstream(t, func(c net.Conn, r *bufio.Reader) {
				buf := make([]byte, 64<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}),
			22: newUpstream(t, func(c net.Conn, r *bufio.Reader) {
				io.WriteString(c, "SSH-2.0-fake\r\n")
				line, _ := r.ReadString('\n')
				io.WriteString(c, "got "+line)
			}),
		},
	}
	p, err := policy.Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	stackSide, sandboxSide := egresstest.NewLink(egress.DefaultMTU)
	opts := egress.Options{
		SandboxID:   "sbx1",
		Link:        stackSide,
		Policy:      p,
		DNSUpstream: e.dns.Addr,
		Recorder:    e.rec,
		PeekTimeout: 2 * time.Second,
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			e.mu.Lock()
			e.dials = append(e.dials, address)
			e.mu.Unlock()
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return nil, err
			}
			u := e.ups[ap.Port()]
			if u == nil {
				return nil, errors.New("connection refused (no fake upstream)")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, u.l.Addr().String())
		},
	}
	if mod != nil {
		mod(&opts)
	}
	st, err := egress.New(context.Background(), opts)
	if err != nil {
		t.Fatalf("egress.New: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	e.st = st
	e.sb = egresstest.NewSandbox(t, sandboxSide)
	return e
}

func (e *env) lookup(t testing.TB, name string) []netip.Addr {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	as, err := e.sb.Resolver().LookupNetIP(ctx, "ip", name)
	if err != nil {
		return nil
	}
	slices.SortFunc(as, netip.Addr.Compare)
	return as
}

func (e *env) get(t testing.TB, dst netip.AddrPort, host string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.sb.DialTCP(ctx, dst)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// waitEvents polls for n events of proto (TCP flows are recorded when the
// stack has finished with them, shortly after the client sees the end).
func (e *env) waitEvents(t *testing.T, proto string, n int) []egress.FlowEvent {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var evs []egress.FlowEvent
		for _, ev := range e.rec.Events() {
			if ev.Proto == proto {
				evs = append(evs, ev)
			}
		}
		if len(evs) >= n || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

var allowList = policy.Spec{Allow: []policy.Rule{
	{Name: "allowed.test"}, {Name: "shared.test"},
	{Name: "ssh.test", Ports: []policy.PortRange{{Lo: 22, Hi: 22}}},
	{Name: "rebind.test"},
}}

func TestAllowedByName(t *testing.T) {
	e := newEnv(t, allowList, nil)
	as := e.lookup(t, "allowed.test")
	want := []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("2001:db8::10")}
	if !slices.Equal(as, want) {
		t.Fatalf("lookup(allowed.test) = %v, want %v", as, want)
	}
	for _, a := range as {
		got, err := e.get(t, netip.AddrPortFrom(a, 80), "allowed.test")
		if err != nil || got != "hello allowed.test" {
			t.Errorf("GET http://allowed.test/ via %v = %q, %v, want hello allowed.test", a, got, err)
		}
	}
	flows := e.waitEvents(t, "tcp", 2)
	if len(flows) != 2 {
		t.Fatalf("tcp events = %+v, want 2", flows)
	}
	for _, ev := range flows {
		if !ev.Allowed || ev.Reason != policy.ReasonAllowName || ev.Name != "allowed.test" || ev.Observed != "allowed.test" ||
			ev.SandboxID != "sbx1" || ev.BytesIn == 0 || ev.BytesOut == 0 || ev.Src.Addr() == (netip.Addr{}) {
			t.Errorf("event = %+v, want an allowed allow-name flow with bytes", ev)
		}
	}
}

// TestDenied checks the ways out a proxy must refuse: each attempt fails in
// the sandbox AND no upstream received a byte of it.
func TestDenied(t *testing.T) {
	e := newEnv(t, allowList, func(o *egress.Options) {
		o.HostAddrs = []netip.Addr{netip.MustParseAddr("203.0.113.20")} // shared.test is "the host"
	})
	e.lookup(t, "allowed.test")
	e.lookup(t, "shared.test")

	t.Run("ip without dns", func(t *testing.T) {
		if _, err := e.get(t, ap("203.0.113.66:80"), "evil.test"); err == nil {
			t.Errorf("GET 203.0.113.66 succeeded, want refused")
		}
	})
	t.Run("metadata", func(t *testing.T) {
		// (127.0.0.1 is not here: the sandbox-side netstack itself drops
		// loopback destinations as martians; policy_test covers it.)
		for _, dst := range []string{"169.254.169.254:80", "[fd00:ec2::254]:80", "100.100.100.200:80", "[::ffff:169.254.169.254]:80", "10.0.2.2:80", "10.0.2.3:80", "10.0.2.7:80"} {
			if _, err := e.get(t, ap(dst), "allowed.test"); err == nil {
				t.Errorf("GET %s succeeded, want refused", dst)
			}
		}
	})
	t.Run("host address", func(t *testing.T) {
		if _, err := e.get(t, ap("203.0.113.20:80"), "shared.test"); err == nil {
			t.Errorf("GET host address succeeded, want refused")
		}
	})
	t.Run("dns names", func(t *testing.T) {
		for _, n := range []string{"evil.test", "evilallowed.test", "allowed.test.evil.test", "x.allowed.test"} {
			if as := e.lookup(t, n); as != nil {
				t.Errorf("lookup(%s) = %v, want NXDOMAIN", n, as)
			}
		}
		for _, q := range e.dns.Queries() {
			if !strings.HasPrefix(q, "allowed.test. ") && !strings.HasPrefix(q, "shared.test. ") {
				t.Errorf("upstream DNS saw %q, want only allowed names", q)
			}
		}
	})
	t.Run("host header mismatch", func(t *testing.T) {
		if got, err := e.get(t, ap("203.0.113.10:80"), "evil.test"); err == nil {
			t.Errorf("GET 203.0.113.10 Host: evil.test = %q, want refused", got)
		}
		if got, err := e.get(t, ap("203.0.113.10:80"), "shared.test"); err == nil {
			t.Errorf("GET 203.0.113.10 Host: shared.test = %q, want refused (not handed out for that address)", got)
		}
	})
	t.Run("sni mismatch", func(t *testing.T) {
		for _, sni := range []string{"evil.test", "shared.test"} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c, err := e.sb.DialTCP(ctx, ap("203.0.113.10:443"))
			cancel()
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
			tc.SetDeadline(time.Now().Add(5 * time.Second))
			if err := tc.Handshake(); err == nil {
				t.Errorf("TLS handshake with SNI %s succeeded", sni)
			}
			c.Close()
		}
	})
	t.Run("udp", func(t *testing.T) {
		c, err := e.sb.DialUDP(ap("203.0.113.10:443"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("quic"))
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, err := c.Read(make([]byte, 10)); err == nil {
			t.Errorf("UDP read = %d bytes, want nothing", n)
		}
	})
	t.Run("port", func(t *testing.T) {
		e.lookup(t, "ssh.test")
		if _, err := e.get(t, ap("203.0.113.22:80"), "ssh.test"); err == nil {
			t.Errorf("GET ssh.test:80 succeeded, want refused (rule is port 22)")
		}
	})

	// Oracle: no upstream received anything from a denied attempt. The
	// name-verified flows were dialed (dial-before-accept) but got no byte.
	for port, u := range e.ups {
		for _, got := range u.received() {
			if got != "" {
				t.Errorf("upstream :%d received %q, want nothing", port, got)
			}
		}
	}
	for _, d := range e.dialed() {
		if d != "203.0.113.10:80" && d != "203.0.113.10:443" {
			t.Errorf("daemon dialed %s, want only the allowed name's address", d)
		}
	}
	reasons := map[string]bool{}
	for _, ev := range e.rec.Events() {
		if ev.Proto != "dns" && ev.Allowed {
			t.Errorf("event %+v allowed, want every flow denied", ev)
		}
		reasons[ev.Reason] = true
	}
	for _, r := range []string{policy.ReasonDefaultDeny, policy.ReasonNeverReachable, policy.ReasonPrivate,
		policy.ReasonNameNotAllowed, policy.ReasonNameMismatch, egress.ReasonUDP} {
		if !reasons[r] {
			t.Errorf("no event with reason %s; events: %+v", r, e.rec.Events())
		}
	}
}

func TestRebindingRefused(t *testing.T) {
	e := newEnv(t, allowList, nil)
	e.dns.SetTTL("rebind.test", 0)
	e.dns.Set("rebind.test", "169.254.169.254")
	if as := e.lookup(t, "rebind.test"); as != nil {
		t.Errorf("lookup(rebind.test → metadata) = %v, want none", as)
	}
	if _, err := e.get(t, ap("169.254.169.254:80"), "rebind.test"); err == nil {
		t.Errorf("GET metadata after rebinding succeeded")
	}
	if d := e.dialed(); len(d) != 0 {
		t.Errorf("daemon dialed %v, want nothing", d)
	}
}

func TestServerFirstProtocol(t *testing.T) {
	e := newEnv(t, allowList, nil)
	e.lookup(t, "ssh.test")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.sb.DialTCP(ctx, ap("203.0.113.22:22"))
	if err != nil {
		t.Fatalf("dial ssh.test:22: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	banner, err := r.ReadString('\n')
	if err != nil || banner != "SSH-2.0-fake\r\n" {
		t.Fatalf("banner = %q, %v", banner, err)
	}
	io.WriteString(c, "SSH-2.0-client\r\n")
	if got, err := r.ReadString('\n'); err != nil || got != "got SSH-2.0-client\r\n" {
		t.Errorf("reply = %q, %v", got, err)
	}
}

func TestAllowAllAndCIDR(t *testing.T) {
	e := newEnv(t, policy.Spec{AllowAll: true, Deny: []policy.Rule{{Name: "evil.test"}}}, nil)
	if got, err := e.get(t, ap("198.51.100.1:80"), "whatever.test"); err != nil || got != "hello whatever.test" {
		t.Errorf("GET under allow-all = %q, %v", got, err)
	}
	if _, err := e.get(t, ap("198.51.100.1:80"), "evil.test"); err == nil {
		t.Errorf("GET Host: evil.test under allow-all with deny rule succeeded")
	}
	if as := e.lookup(t, "evil.test"); as != nil {
		t.Errorf("lookup(evil.test) = %v, want NXDOMAIN", as)
	}
	if _, err := e.get(t, ap("10.0.0.1:80"), "x"); err == nil {
		t.Errorf("GET private address under allow-all succeeded")
	}

	// SetPolicy: deny-all for new flows.
	p, _ := policy.Compile(policy.Spec{})
	e.st.SetPolicy(p)
	if _, err := e.get(t, ap("198.51.100.1:80"), "whatever.test"); err == nil {
		t.Errorf("GET after SetPolicy(deny all) succeeded")
	}
}

func TestIngress(t *testing.T) {
	e := newEnv(t, policy.Spec{}, nil)
	l, err := e.sb.ListenTCP(8080)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.st.DialSandbox(ctx, 8080)
	if err != nil {
		t.Fatalf("DialSandbox: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Errorf("echo = %q, %v", buf, err)
	}
	if _, err := e.st.DialSandbox(ctx, 8081); err == nil {
		t.Errorf("DialSandbox(closed port) succeeded")
	}
}

func TestConnLimit(t *testing.T) {
	e := newEnv(t, policy.Spec{Allow: []policy.Rule{{Prefix: netip.MustParsePrefix("203.0.113.0/24")}}}, func(o *egress.Options) { o.MaxConns = 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var open []net.Conn
	for range 2 {
		c, err := e.sb.DialTCP(ctx, ap("203.0.113.1:9"))
		if err != nil {
			t.Fatalf("dial within limit: %v", err)
		}
		open = append(open, c)
	}
	if c, err := e.sb.DialTCP(ctx, ap("203.0.113.1:9")); err == nil {
		c.Close()
		t.Errorf("third dial succeeded with MaxConns 2")
	}
	for _, c := range open {
		c.Close()
	}
}

// TestBandwidth checks that Options.Bandwidth holds a sandbox's download
// rate. The assertion is a lower bound on the time 2 MiB take at 2 MiB/s:
// the limiter makes it impossible to finish sooner, whatever the machine.
func TestBandwidth(t *testing.T) {
	const bw = 2 << 20
	e := newEnv(t, cidrSpec, func(o *egress.Options) { o.Bandwidth = bw })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := e.sb.DialTCP(ctx, ap("203.0.113.1:19"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.ReadFull(c, make([]byte, 2<<20)); err != nil {
		t.Fatal(err)
	}
	// Burst (bw/10) plus the bytes in flight in the stacks' buffers may
	// come at once; the rest is paced.
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("2 MiB at a %d B/s limit took %v, want ≥ 500ms", bw, took)
	}
}

func TestNewErrors(t *testing.T) {
	p, _ := policy.Compile(policy.Spec{})
	a, _ := egresstest.NewLink(1500)
	for _, o := range []egress.Options{
		{Policy: p, DNSUpstream: "127.0.0.1:53"},
		{Link: a, DNSUpstream: "127.0.0.1:53"},
		{Link: a, Policy: p},
	} {
		if st, err := egress.New(context.Background(), o); err == nil {
			st.Close()
			t.Errorf("New(%+v) = nil error", o)
		}
	}
}
