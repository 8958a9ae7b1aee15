package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

// takeAll is an interceptor that takes the TLS flows of one name and the
// HTTP flows of one host, and answers them itself: it reads what the
// stack hands over (the peeked bytes must come first) and writes back a
// line naming what it got.
type takeAll struct {
	tlsName, httpHost string

	mu  sync.Mutex
	got []egress.InterceptedFlow
	hdr [][]byte
}

func (i *takeAll) InterceptTLS(sni string) bool   { return sni == i.tlsName }
func (i *takeAll) InterceptHTTP(host string) bool { return host == i.httpHost }

func (i *takeAll) Serve(ctx context.Context, f egress.InterceptedFlow) (int64, int64) {
	defer f.Conn.Close()
	if f.Upstream != nil {
		f.Upstream.Close()
	}
	buf := make([]byte, 5)
	f.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _ := io.ReadFull(f.Conn, buf)
	i.mu.Lock()
	i.got = append(i.got, f)
	i.hdr = append(i.hdr, buf[:n])
	i.mu.Unlock()
	m, _ := io.WriteString(f.Conn, "intercepted sni="+f.SNI+" dst="+f.Dst.String()+"\n")
	return int64(n), int64(m)
}

func TestInterceptorTakesWhatItAsksFor(t *testing.T) {
	icpt := &takeAll{tlsName: "allowed.test", httpHost: "allowed.test"}
	e := newEnv(t, allowList, func(o *egress.Options) { o.Interceptor = icpt })
	e.lookup(t, "allowed.test")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// TLS for the name it wants: handed over, ClientHello intact.
	c, err := e.sb.DialTCP(ctx, ap("203.0.113.10:443"))
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "allowed.test", InsecureSkipVerify: true})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	// The handshake fails (the interceptor answers in plain text), but
	// the ClientHello reached it.
	tc.Handshake()
	c.Close()

	// Plain HTTP for the host it wants: handed over, request head first.
	c2, err := e.sb.DialTCP(ctx, ap("203.0.113.10:80"))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c2, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c2).ReadString('\n')
	c2.Close()
	if err != nil || !strings.HasPrefix(line, "intercepted sni= dst=203.0.113.10:80") {
		t.Errorf("plain HTTP answer = %q, %v, want the interceptor's", line, err)
	}

	// A name it does not want goes upstream as before.
	if got, err := e.get(t, ap("203.0.113.10:80"), "ALLOWED.test"); err == nil && strings.HasPrefix(got, "intercepted") {
		t.Errorf("a host the interceptor did not ask for was intercepted: %q", got)
	}

	icpt.mu.Lock()
	defer icpt.mu.Unlock()
	if len(icpt.got) != 2 {
		t.Fatalf("interceptor got %d flows, want 2", len(icpt.got))
	}
	if f, h := icpt.got[0], icpt.hdr[0]; f.SNI != "allowed.test" || len(h) < 3 || h[0] != 0x16 || h[1] != 3 {
		t.Errorf("TLS flow = sni %q first bytes %x, want allowed.test and a TLS record", f.SNI, h)
	}
	if h := icpt.hdr[1]; string(h) != "GET /" {
		t.Errorf("HTTP flow first bytes = %q, want the request line", h)
	}
	for _, f := range icpt.got {
		if len(f.Names) == 0 || f.Names[0] != "allowed.test" || f.Dial == nil {
			t.Errorf("flow = %+v, want the names the address was handed out for and a dialer", f)
		}
	}
	flows := e.waitEvents(t, "tcp", 3)
	n := 0
	for _, ev := range flows {
		if ev.Intercepted {
			n++
		}
	}
	if n != 2 {
		t.Errorf("intercepted flow events = %d of %+v, want 2", n, flows)
	}
}

// TestInterceptorLeavesServerFirst: a server-first protocol is never
// handed over, even on a flow the stack peeks at for the interceptor.
func TestInterceptorLeavesServerFirst(t *testing.T) {
	icpt := &takeAll{tlsName: "ssh.test", httpHost: "ssh.test"}
	e := newEnv(t, policy.Spec{AllowAll: true}, func(o *egress.Options) { o.Interceptor = icpt })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.sb.DialTCP(ctx, ap("203.0.113.22:22"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if banner, err := r.ReadString('\n'); err != nil || banner != "SSH-2.0-fake\r\n" {
		t.Fatalf("banner = %q, %v", banner, err)
	}
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: ssh.test\r\n\r\n")
	if got, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(got, "got GET") {
		t.Errorf("reply = %q, %v, want the upstream's", got, err)
	}
	// Allowed without a name: a default-allow flow is peeked for the
	// interceptor, and relayed as it is when it does not want it.
	if got, err := e.get(t, ap("198.51.100.1:80"), "whatever.test"); err != nil || got != "hello whatever.test" {
		t.Errorf("GET under allow-all = %q, %v", got, err)
	}
}

// dialAll is an interceptor that opens upstream connections with the
// flow's Dial until one is refused, and reports how many it got.
type dialAll struct{ got chan int }

func (dialAll) InterceptTLS(string) bool  { return false }
func (dialAll) InterceptHTTP(string) bool { return true }
func (i dialAll) Serve(ctx context.Context, f egress.InterceptedFlow) (int64, int64) {
	defer f.Conn.Close()
	f.Upstream.Close()
	n := 0
	var conns []io.Closer
	for ; n < 100; n++ {
		c, err := f.Dial(ctx)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
	// Closed ones are given back.
	if c, err := f.Dial(ctx); err == nil {
		c.Close()
	} else {
		n = -1
	}
	i.got <- n
	return 0, 0
}

// TestInterceptorDialsCountAsFlows: the upstream connections an
// interceptor opens hold the sandbox's flow slots, so a sandbox cannot
// make the daemon open more than its flow limit through the gateway.
func TestInterceptorDialsCountAsFlows(t *testing.T) {
	icpt := dialAll{got: make(chan int, 1)}
	e := newEnv(t, allowList, func(o *egress.Options) { o.Interceptor = icpt; o.MaxConns = 4 })
	e.lookup(t, "allowed.test")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := e.sb.DialTCP(ctx, ap("203.0.113.10:80"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	select {
	case n := <-icpt.got:
		// The flow itself holds one of the four slots.
		if n != 3 {
			t.Errorf("the interceptor opened %d further upstream connections, want 3 (then refused, and slots given back on close)", n)
		}
	case <-ctx.Done():
		t.Fatal("the interceptor did not report")
	}
}
