package egress

import (
	"context"
	"errors"
	"golang.org/x/time/rate"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/egress/sniff"
)

func flowAddrs(id stack.TransportEndpointID) (src, dst netip.AddrPort) {
	// From the stack's point of view the sandbox is remote and the
	// destination it asked for is local.
	return netip.AddrPortFrom(fromTCPIP(id.RemoteAddress), id.RemotePort),
		netip.AddrPortFrom(fromTCPIP(id.LocalAddress), id.LocalPort)
}

// handleTCP decides one SYN. It runs on its own goroutine (the forwarder
// starts one per request).
func (st *Stack) handleTCP(r *tcp.ForwarderRequest) {
	start := time.Now()
	src, dst := flowAddrs(r.ID())
	ev := FlowEvent{Proto: "tcp", Src: src, Dst: dst, Start: start}
	if st.hostAddr[dst.Addr().Unmap()] {
		st.refuseTCP(r, &ev, ReasonHostAddr, "")
		return
	}
	pol := st.policy.Load()
	names := st.resolver.NamesFor(dst.Addr())
	d := pol.Decide(policy.Flow{Proto: policy.TCP, Dst: dst, Names: names})
	ev.Name = d.Name
	if refused, reason, rule := st.refusal(d); refused {
		st.refuseTCP(r, &ev, reason, rule)
		return
	}
	fl, ok := st.acquireFlow()
	if !ok {
		st.refuseTCP(r, &ev, ReasonLimit, "")
		return
	}
	defer fl.release()
	up, down, ep, ok := st.connectTCP(r, &ev, d, fl)
	if !ok {
		return
	}
	defer st.untrack(down)

	ev.Allowed, ev.Reason, ev.Rule = true, d.Reason, d.Rule
	var (
		peeked      []byte
		checkHTTP   bool // every request is checked on its way up
		serverFirst bool
	)
	upDone := make(chan int64, 1)
	downSize := st.downRelaySizes(dst.Addr(), fl.small)
	grow := func() { fl.growSend(ep); fl.keepWriter() }
	first := newFirstBytes(up)
	icpt := st.opts.Interceptor
	if d.VerifyName || icpt != nil {
		// Let the upstream speak first while we wait for the client's
		// first bytes; nothing goes upstream until the name is checked.
		spoke := &countingConn{Conn: down}
		held := &holdConn{Conn: first}
		go func() { upDone <- copyHalf(st.ctx, spoke, held, st.downLimit, downSize, grow) }()
		var res sniff.Result
		var serr error
		peeked, res, serverFirst, serr = st.peekStart(down, spoke, d)
		checkHTTP = judgeStart(&ev, pol, d, names, res, serr, serverFirst)
		if !ev.Allowed {
			abort(ep)
			down.Close()
			up.Close()
			ev.BytesIn = <-upDone
			ev.Duration = time.Since(start)
			st.record(ev)
			return
		}
		if icpt != nil && !serverFirst && wantsIntercept(icpt, res, peeked) {
			st.intercept(&ev, d, icpt, held, spoke, upDone, up, down, peeked, dst, names, res)
			ev.Duration = time.Since(start)
			st.record(ev)
			return
		}
	} else {
		go func() { upDone <- copyHalf(st.ctx, down, first, st.downLimit, downSize, grow) }()
	}
	if checkHTTP {
		st.forwardHTTP(&ev, d, pol, names, up, down, ep, peeked, first, serverFirst)
		ev.BytesIn = <-upDone
	} else {
		ev.BytesOut = st.relayUp(&ev, up, down, peeked)
		ev.BytesIn = <-upDone
		down.Close()
		up.Close()
	}
	ev.Duration = time.Since(start)
	st.record(ev)
}

// refuseTCP resets the sandbox's connection and records the flow as
// refused for reason.
func (st *Stack) refuseTCP(r *tcp.ForwarderRequest, ev *FlowEvent, reason, rule string) {
	r.Complete(true)
	ev.Reason, ev.Rule = reason, rule
	st.record(*ev)
}

// connectTCP dials the flow's upstream and only then completes the
// sandbox's handshake (down, on endpoint ep), sized for the flow fl. ok
// is false when the flow ended here: the dial or the endpoint failed
// (recorded), or the stack is closing.
func (st *Stack) connectTCP(r *tcp.ForwarderRequest, ev *FlowEvent, d policy.Decision, fl *flow) (up net.Conn, down *gonet.TCPConn, ep tcpip.Endpoint, ok bool) {
	ctx, cancel := context.WithTimeout(st.ctx, st.opts.ConnectTimeout)
	up, err := st.dialUpstream(ctx, ev.Dst, d)
	cancel()
	if err != nil {
		ev.Err = err.Error()
		st.refuseTCP(r, ev, ReasonDialFailed, d.Rule)
		return nil, nil, nil, false
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		up.Close()
		ev.Allowed, ev.Reason, ev.Rule, ev.Err = true, d.Reason, d.Rule, terr.String()
		st.record(*ev)
		return nil, nil, nil, false
	}
	r.Complete(false)
	fl.size(ep)
	ep.SocketOptions().SetKeepAlive(true)
	down = gonet.NewTCPConn(&wq, ep)
	if !st.trackFlow(down, ep) {
		down.Close()
		up.Close()
		return nil, nil, nil, false
	}
	// Admitted again now that EndFlows reaches it: an EndFlows that ran
	// while the upstream was dialled (the sandbox's team spent its day
	// then) did not.
	if reason := st.admit(); reason != "" {
		st.untrack(down)
		abort(ep)
		down.Close()
		up.Close()
		ev.Reason, ev.Rule = reason, ""
		st.record(*ev)
		return nil, nil, nil, false
	}
	return up, down, ep, true
}

// peekStart reads the client's first bytes from down while the upstream
// may speak first (spoke counts what it sent the client); serverFirst
// reports that it did, before the client's first bytes. A flow that was
// peeked only for the gateway (no name to verify) is not refused for what
// its bytes are.
func (st *Stack) peekStart(down *gonet.TCPConn, spoke *countingConn, d policy.Decision) (peeked []byte, res sniff.Result, serverFirst bool, serr error) {
	// The upstream spoke first if it sent anything before the
	// client's first bytes (nothing of the client's has left yet).
	spokeFirst := func() bool { return spoke.n.Load() > 0 }
	byName := d.Reason == policy.ReasonAllowName
	loose := func() bool { return byName && !spokeFirst() }
	peeked, res, serr = peek(down, st.opts.PeekTimeout, loose)
	serverFirst = spokeFirst()
	if !d.VerifyName {
		// Peeked only for the gateway: whatever the bytes are, the
		// flow was allowed without them.
		serr = nil
		if serverFirst {
			res = sniff.Result{}
		}
	}
	if d.VerifyName && serr == nil && len(peeked) == 0 {
		// The client said nothing in time. Only a server-first
		// protocol (the upstream spoke: SSH, SMTP) may go on, and
		// its first client bytes are still checked; a silent
		// upstream means a client waiting to get past the check.
		if spoke.n.Load() == 0 {
			serr = sniff.ErrMalformed
		} else {
			serverFirst = true
			peeked, res, serr = peek(down, 0, loose)
		}
	}
	return peeked, res, serverFirst, serr
}

// judgeStart decides an admitted flow (d) again from its client's first
// bytes (res, or serr when they could not be read) and records the
// verdict in ev; checkHTTP is set for an HTTP/1.x client on a flow whose
// name is to be verified.
func judgeStart(ev *FlowEvent, pol *policy.Policy, d policy.Decision, names []string, res sniff.Result, serr error, serverFirst bool) (checkHTTP bool) {
	byName := d.Reason == policy.ReasonAllowName
	ev.Observed = res.Name
	switch {
	case serr != nil:
		ev.Allowed, ev.Reason = false, ReasonSniff
	case res.Kind == sniff.TLS && d.VerifyName:
		// A TLS ClientHello without SNI names nothing: refused, or
		// it would reach every name the address serves.
		d2 := pol.Decide(policy.Flow{Proto: policy.TCP, Dst: ev.Dst, Names: names, Observed: res.Name})
		ev.Allowed, ev.Reason, ev.Rule, ev.Name = d2.Allow, d2.Reason, d2.Rule, d2.Name
		if res.Name == "" {
			ev.Allowed, ev.Reason = false, ReasonNoName
		}
	case res.Kind == sniff.HTTP:
		// Every request's Host is checked as it goes (relayHTTP).
		checkHTTP = d.VerifyName
	case byName && !serverFirst:
		// Admitted for a name, the client spoke first, and it is
		// neither TLS nor HTTP/1.x: nothing names what it reaches.
		ev.Allowed, ev.Reason = false, ReasonNotHTTP
	}
	return checkHTTP
}

// relayUp sends the client's peeked bytes and then the rest of what it
// sends upstream, and gives the bytes sent; a failed write of the peeked
// bytes is recorded in ev.
func (st *Stack) relayUp(ev *FlowEvent, up, down net.Conn, peeked []byte) int64 {
	var out int64
	if len(peeked) > 0 {
		n, err := up.Write(peeked)
		out += int64(n)
		if err != nil {
			ev.Err = err.Error()
		}
	}
	out += copyHalf(st.ctx, up, down, st.upLimit, upRelay, nil)
	return out
}

// forwardHTTP relays a flow whose client speaks HTTP/1.x, checking the
// Host of every request against the policy before it leaves, and ends
// the flow (RST to the sandbox) at the first refusal, which ev records.
func (st *Stack) forwardHTTP(ev *FlowEvent, d policy.Decision, pol *policy.Policy, names []string,
	up, down net.Conn, ep tcpip.Endpoint, peeked []byte, first *firstBytes, serverFirst bool) {
	byName := d.Reason == policy.ReasonAllowName
	checked := 0
	cfg := sniff.HTTPConfig{Allow: func(host string) error {
		if byName && isIPLiteral(host) {
			// The address itself names no site: on a shared address
			// it reaches the server's default one.
			ev.Observed, ev.Reason, ev.Rule, ev.Name = host, policy.ReasonNameNotAllowed, "", ""
			return errRefused
		}
		d2 := pol.Decide(policy.Flow{Proto: policy.TCP, Dst: ev.Dst, Names: names, Observed: host})
		if !d2.Allow {
			ev.Observed, ev.Reason, ev.Rule, ev.Name = host, d2.Reason, d2.Rule, d2.Name
			return errRefused
		}
		if checked == 0 {
			ev.Observed, ev.Reason, ev.Rule, ev.Name = host, d2.Reason, d2.Rule, d2.Name
		}
		checked++
		return nil
	}}
	if !serverFirst {
		// A WebSocket upgrade as the first request: the stream is opaque
		// once the server's first answer is a 101.
		cfg.Switched = func() bool { return first.switched(st.ctx) }
	}
	out, checkErr, copyErr := relayHTTP(st.ctx, up, down, peeked, st.upLimit, cfg)
	ev.BytesOut = out
	switch {
	case checkErr != nil:
		ev.Allowed = false
		if !errors.Is(checkErr, errRefused) {
			ev.Reason = httpReason(checkErr)
			ev.Err = checkErr.Error()
		}
		abort(ep)
		down.Close()
		up.Close()
	case copyErr != nil:
		ev.Err = copyErr.Error()
		down.Close()
		up.Close()
	}
}

// waitN waits until lim allows n bytes, in steps no larger than its burst.
func waitN(ctx context.Context, lim *rate.Limiter, n int) error {
	for n > 0 {
		k := min(n, lim.Burst())
		if err := lim.WaitN(ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// abort makes the next close send RST instead of FIN.
func abort(ep tcpip.Endpoint) {
	ep.SocketOptions().SetLinger(tcpip.LingerOption{Enabled: true, Timeout: 0})
}

// peek reads the first bytes of the client stream until classify can tell
// TLS (and its SNI), HTTP or anything else, the buffer is full, or timeout
// passes (0: no timeout). A
// timeout with no byte at all is not an error (server-first protocol or
// idle client); the caller decides.
func peek(c *gonet.TCPConn, timeout time.Duration, loose func() bool) ([]byte, sniff.Result, error) {
	buf := make([]byte, 0, sniff.MaxPeek)
	if timeout > 0 {
		c.SetReadDeadline(time.Now().Add(timeout))
		defer c.SetReadDeadline(time.Time{})
	}
	for {
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if n > 0 {
			res, serr := classify(buf, loose())
			switch {
			case serr == nil:
				return buf, res, nil
			case !errors.Is(serr, sniff.ErrNeedMore):
				return buf, res, serr
			case len(buf) == cap(buf) && buf[0] != 0x16:
				// An endless first line or blank lines: the HTTP
				// checker judges it.
				return buf, sniff.Result{Kind: sniff.HTTP}, nil
			case len(buf) == cap(buf):
				return buf, res, sniff.ErrMalformed
			}
		}
		if err != nil {
			if len(buf) == 0 && (errors.Is(err, os.ErrDeadlineExceeded) || isTimeout(err) || errors.Is(err, io.EOF)) {
				return buf, sniff.Result{}, nil
			}
			return buf, sniff.Result{}, sniff.ErrMalformed
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Relay buffers: bufPool's for the copy towards the upstream (and for
// both directions of a small flow), bulkPool's for the copy towards the
// sandbox of a full flow. See downRelaySize.
var (
	bufPool  = sync.Pool{New: func() any { b := make([]byte, relayBufSize); return &b }}
	bulkPool = sync.Pool{New: func() any { b := make([]byte, bulkRelayBufSize); return &b }}
)

// relaySizes are how much a copy reads at once: first until a read fills
// its buffer, then most (a larger buffer is taken then, so that a short
// or idle flow holds only the small one).
type relaySizes struct{ first, most int }

var upRelay = relaySizes{relayBufSize, relayBufSize}

// downRelaySizes are the read sizes of the copy towards the sandbox: whole
// numbers of the stack's TCP segments to the sandbox, as many as fit the
// buffers (the bulk one only for a full flow). The stack sends each write
// as full segments and a remainder (it never splits one write's data to
// fill another's segment), so a 64 KiB read with 65,440-byte segments
// made a 96-byte segment for every full one: twice the packets, writes
// to the device and acknowledgements for the same bytes.
func (st *Stack) downRelaySizes(dst netip.Addr, small bool) relaySizes {
	most := bulkRelayBufSize
	if small {
		most = relayBufSize
	}
	return relaySizes{st.segmentAligned(dst, relayBufSize), st.segmentAligned(dst, most)}
}

// segmentAligned returns n rounded down to a whole number of the stack's
// TCP segments to dst (n itself if not even one fits).
func (st *Stack) segmentAligned(dst netip.Addr, n int) int {
	ipHdr := header.IPv4MinimumSize
	if dst.Is6() && !dst.Is4In6() {
		ipHdr = header.IPv6MinimumSize
	}
	// The stack's segment payload: the link's MTU less the headers and
	// room for the largest TCP options (as gVisor's sender reserves).
	seg := int(st.link.MTU()) - ipHdr - header.TCPMinimumSize - header.TCPOptionsMaximumSize
	if seg <= 0 || seg > n {
		return n
	}
	return n / seg * seg
}

type closeWriter interface{ CloseWrite() error }

// countingConn counts the bytes written to it (offered, counted before
// the write). Once held, closing it
// does nothing (its copier is being stopped to hand the flow over).
type countingConn struct {
	net.Conn
	n    atomic.Int64
	held atomic.Bool
}

// Close closes the underlying connection unless the conn is held.
func (c *countingConn) Close() error {
	if c.held.Load() {
		return nil
	}
	return c.Conn.Close()
}

func (c *countingConn) Write(b []byte) (int, error) {
	// Counted before they are written: whoever reads the count after the
	// sandbox could have seen these bytes sees them counted.
	c.n.Add(int64(len(b)))
	return c.Conn.Write(b)
}

// CloseWrite half-closes the underlying connection.
func (c *countingConn) CloseWrite() error {
	if c.held.Load() {
		return nil
	}
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// copyHalf copies src to dst until EOF or error, reading as sizes says,
// then half-closes dst (or closes both on error), and returns the byte
// count. If bulk is set, it is called once, after bulkAfter bytes.
func copyHalf(ctx context.Context, dst, src net.Conn, lim *rate.Limiter, sizes relaySizes, bulk func()) int64 {
	pool := &bufPool
	bp := pool.Get().(*[]byte)
	defer func() { pool.Put(bp) }()
	buf := (*bp)[:min(sizes.first, len(*bp))]
	var n int64
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 && lim != nil {
			if err := waitN(ctx, lim, nr); err != nil {
				src.Close()
				dst.Close()
				return n
			}
		}
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			n += int64(nw)
			if bulk != nil && n >= bulkAfter {
				bulk()
				bulk = nil
			}
			if nr == len(buf) && sizes.most > len(buf) && pool == &bufPool {
				// The upstream has more than the small buffer at once.
				bufPool.Put(bp)
				pool = &bulkPool
				bp = pool.Get().(*[]byte)
				buf = (*bp)[:min(sizes.most, len(*bp))]
			}
			if werr != nil {
				src.Close()
				dst.Close()
				return n
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				if cw, ok := dst.(closeWriter); ok {
					cw.CloseWrite()
					return n
				}
			}
			src.Close()
			dst.Close()
			return n
		}
	}
}

// handleUDP receives the first datagram of every UDP 4-tuple that has no
// endpoint: everything but the resolver's own sockets. It is dropped.
func (st *Stack) handleUDP(r *udp.ForwarderRequest) bool {
	src, dst := flowAddrs(r.ID())
	if st.udpDenied.add(src.String()+">"+dst.String(), time.Now()) {
		st.record(FlowEvent{Proto: "udp", Src: src, Dst: dst, Reason: ReasonUDP, Start: time.Now()})
	}
	return true // handled: dropped silently
}
