package egress

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/egress/sniff"
)

// Interceptor takes over the flows a sandbox's egress gateway must see
// inside: TLS flows it terminates (header rules, secrets, inspection,
// download records) and plain-HTTP flows it relays request by request.
// The stack asks it only about flows the policy already allowed; the
// interceptor then decides every request on its own.
type Interceptor interface {
	// InterceptTLS reports whether a TLS flow whose ClientHello names sni
	// is terminated by the gateway. false leaves the flow to the relay,
	// which passes it through untouched.
	InterceptTLS(sni string) bool
	// InterceptHTTP reports whether a plain-HTTP flow whose first request
	// names host goes through the gateway.
	InterceptHTTP(host string) bool
	// Serve relays one intercepted flow until it ends and returns the
	// bytes it carried up (sandbox to upstream) and down.
	Serve(ctx context.Context, f InterceptedFlow) (out, in int64)
}

// NameChecker is implemented by interceptors that also judge the names a
// sandbox looks up: a name it refuses (one that carries a secret's
// placeholder) gets NXDOMAIN and never reaches the upstream resolver.
type NameChecker interface {
	RefuseName(name string) (reason string, refused bool)
}

// InterceptedFlow is one flow handed to an Interceptor.
type InterceptedFlow struct {
	// Conn is the sandbox's side. The bytes the stack peeked at (the
	// ClientHello, the first request head) are read from it first.
	Conn net.Conn
	// Upstream is already connected to Dst (through the sandbox's egress
	// proxy, if it has one). The interceptor owns it: it uses it for its
	// first upstream connection or closes it.
	Upstream net.Conn
	// Dial connects to Dst again, the same way.
	Dial func(ctx context.Context) (net.Conn, error)
	// Dst is the destination the sandbox connected to and the policy
	// allowed. The gateway never connects anywhere else.
	Dst netip.AddrPort
	// Names are the names the sandbox's resolver handed out Dst for.
	Names []string
	// SNI is the TLS server name (normalised); empty for plain HTTP.
	SNI string
}

// wantsIntercept asks the interceptor about a flow whose first client
// bytes are known.
func wantsIntercept(icpt Interceptor, res sniff.Result, peeked []byte) bool {
	switch res.Kind {
	case sniff.TLS:
		return res.Name != "" && icpt.InterceptTLS(res.Name)
	case sniff.HTTP:
		return icpt.InterceptHTTP(httpHost(peeked))
	}
	return false
}

// httpHost returns the Host header of the first request head in b, as far
// as b holds it, or "".
func httpHost(b []byte) string {
	for _, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 {
			continue
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(bytes.TrimSpace(name), []byte("host")) {
			h := string(bytes.TrimSpace(value))
			if host, _, err := net.SplitHostPort(h); err == nil {
				return host
			}
			return h
		}
	}
	return ""
}

// holdConn is the upstream as the pre-peek copier reads it: once held,
// closing it does nothing, so the copier can be stopped (by a read
// deadline) without ending the flow.
type holdConn struct {
	net.Conn
	held atomic.Bool
}

// Close closes the underlying connection unless the conn is held.
func (c *holdConn) Close() error {
	if c.held.Load() {
		return nil
	}
	return c.Conn.Close()
}

// intercept stops the copier that forwarded the upstream's bytes while
// the stack peeked (nothing has come from a client-first upstream), and
// hands the flow to the interceptor.
func (st *Stack) intercept(ev *FlowEvent, d policy.Decision, icpt Interceptor, held *holdConn, spoke *countingConn,
	upDone chan int64, up, down net.Conn, peeked []byte, dst netip.AddrPort, names []string, res sniff.Result) {
	held.held.Store(true)
	spoke.held.Store(true)
	up.SetReadDeadline(time.Now())
	n := <-upDone
	up.SetReadDeadline(time.Time{})
	if n > 0 || st.ctx.Err() != nil {
		// The upstream spoke after all: the flow is not the gateway's.
		down.Close()
		up.Close()
		ev.BytesIn, ev.Err = n, "upstream spoke while the flow was handed over"
		return
	}
	f := InterceptedFlow{
		Conn:     &prefixConn{Conn: down, prefix: peeked},
		Upstream: up,
		// Every further upstream connection the interceptor opens holds a
		// flow slot of the sandbox's own, like a flow of the sandbox's.
		Dial: func(ctx context.Context) (net.Conn, error) {
			fl, ok := st.acquireFlow()
			if !ok {
				return nil, errFlowLimit
			}
			ctx, cancel := context.WithTimeout(ctx, st.opts.ConnectTimeout)
			defer cancel()
			c, err := st.dialUpstream(ctx, dst, d)
			if err != nil {
				fl.release()
				return nil, err
			}
			return &slotConn{Conn: c, release: sync.OnceFunc(fl.release)}, nil
		},
		Dst:   dst,
		Names: names,
	}
	if res.Kind == sniff.TLS {
		f.SNI, _ = policy.NormalizeName(res.Name)
	}
	ev.Intercepted = true
	ev.BytesOut, ev.BytesIn = icpt.Serve(st.ctx, f)
	down.Close()
}

// prefixConn reads prefix before the connection's own bytes.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes the connection when it can.
func (c *prefixConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// errFlowLimit is the error of an interceptor's dial over the sandbox's
// flow limit or memory share.
var errFlowLimit = errors.New("egress: the sandbox has its maximum of flows open")

// slotConn releases its flow slot when closed.
type slotConn struct {
	net.Conn
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
