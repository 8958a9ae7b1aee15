package egress

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/fencesandbox/fence/internal/egress/dns"
)

// Bounds of the resolver's service to one sandbox.
const (
	// maxDNSInFlight bounds queries being resolved at once.
	maxDNSInFlight = 64
	// maxDNSConns bounds open DNS-over-TCP connections; more are closed
	// as soon as they are accepted.
	maxDNSConns = 16
	// dnsBufSize is each DNS-over-TCP connection's receive and send
	// buffer: a client that pipelines queries and never reads blocks on
	// its own side once both are full.
	dnsBufSize = 16 << 10
	// dnsIdle closes a DNS-over-TCP connection that sends no query, and
	// dnsWriteTimeout one that does not read its answer.
	dnsIdle         = 10 * time.Second
	dnsWriteTimeout = 5 * time.Second
)

// serveDNS listens on the resolver addresses, UDP and TCP port 53. An idle
// resolver costs no goroutine: each endpoint is drained by a goroutine
// started when it becomes readable (see onReadable), which ends when it
// would block.
func (st *Stack) serveDNS() error {
	sem := make(chan struct{}, maxDNSInFlight)
	for _, a := range []netip.Addr{ResolverIPv4, ResolverIPv6} {
		proto := ipv4.ProtocolNumber
		if a.Is6() {
			proto = ipv6.ProtocolNumber
		}
		fa := tcpip.FullAddress{NIC: nicID, Addr: toTCPIP(a), Port: 53}
		var uwq waiter.Queue
		uep, terr := st.s.NewEndpoint(udp.ProtocolNumber, proto, &uwq)
		if terr != nil {
			return fmt.Errorf("listening on %v udp/53: %s", a, terr)
		}
		if terr := uep.Bind(fa); terr != nil {
			uep.Close()
			return fmt.Errorf("listening on %v udp/53: %s", a, terr)
		}
		uc := gonet.NewUDPConn(&uwq, uep) // for its writes
		tl, err := st.listenDNSTCP(fa, proto)
		if err != nil {
			uc.Close()
			return fmt.Errorf("listening on %v tcp/53: %w", a, err)
		}
		stopUDP := st.onReadable(&uwq, func() { st.drainDNSUDP(uep, uc, sem) })
		stopTCP := st.onReadable(tl.wq, func() { st.drainDNSTCP(tl, sem) })
		context.AfterFunc(st.ctx, func() {
			stopUDP()
			stopTCP()
			uc.Close()
			tl.close()
		})
	}
	return nil
}

// onReadable runs drain in a goroutine of its own whenever wq reports the
// endpoint readable and no drain is running, until stop is called. drain
// handles everything ready and returns when it would block; an event that
// arrives meanwhile makes it run again.
func (st *Stack) onReadable(wq *waiter.Queue, drain func()) (stop func()) {
	var running, again atomic.Bool
	kick := func() {
		again.Store(true)
		if !running.CompareAndSwap(false, true) {
			return // the running drain will see again
		}
		st.mu.Lock()
		if st.closed {
			st.mu.Unlock()
			running.Store(false)
			return
		}
		st.wg.Add(1)
		st.mu.Unlock()
		go func() {
			defer st.wg.Done()
			for {
				again.Store(false)
				drain()
				running.Store(false)
				if !again.Load() || !running.CompareAndSwap(false, true) {
					return
				}
			}
		}()
	}
	entry := waiter.NewFunctionEntry(waiter.ReadableEvents, func(waiter.EventMask) { kick() })
	wq.EventRegister(&entry)
	kick() // whatever arrived before the registration
	return func() { wq.EventUnregister(&entry) }
}

// drainDNSUDP answers every query waiting on ep, then returns.
func (st *Stack) drainDNSUDP(ep tcpip.Endpoint, uc *gonet.UDPConn, sem chan struct{}) {
	buf := make([]byte, 1500)
	for {
		w := tcpip.SliceWriter(buf)
		res, terr := ep.Read(&w, tcpip.ReadOptions{NeedRemoteAddr: true})
		if terr != nil {
			return // would block, or closed
		}
		n := res.Count
		from := &net.UDPAddr{IP: net.IP(res.RemoteAddr.Addr.AsSlice()), Port: int(res.RemoteAddr.Port)}
		if !st.dnsQueries.Allow() {
			st.opts.Shared.stats.dnsLimited.Add(1)
			continue // over the rate: dropped, the client retries
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // overloaded: drop, the client retries
		}
		q := bytes.Clone(buf[:n])
		go func() {
			defer func() { <-sem }()
			resp := st.resolve(q, addrPortOf(from), uc.LocalAddr(), "udp")
			if resp != nil {
				uc.WriteTo(resp, from)
			}
		}()
	}
}

// dnsListener accepts DNS-over-TCP connections whose buffers are fixed at
// dnsBufSize.
type dnsListener struct {
	ep   tcpip.Endpoint
	wq   *waiter.Queue
	done chan struct{}
	once sync.Once
}

func (st *Stack) listenDNSTCP(fa tcpip.FullAddress, proto tcpip.NetworkProtocolNumber) (*dnsListener, error) {
	var wq waiter.Queue
	ep, terr := st.s.NewEndpoint(tcp.ProtocolNumber, proto, &wq)
	if terr != nil {
		return nil, errors.New(terr.String())
	}
	// The listener's receive buffer is what accepted connections start
	// with (and keep: set explicitly, it is not auto-tuned).
	ep.SocketOptions().SetReceiveBufferSize(dnsBufSize, true)
	if terr := ep.Bind(fa); terr != nil {
		ep.Close()
		return nil, errors.New(terr.String())
	}
	if terr := ep.Listen(maxDNSConns); terr != nil {
		ep.Close()
		return nil, errors.New(terr.String())
	}
	return &dnsListener{ep: ep, wq: &wq, done: make(chan struct{})}, nil
}

// acceptNow takes a pending connection, or fails when none is waiting.
func (l *dnsListener) acceptNow() (*gonet.TCPConn, error) {
	select {
	case <-l.done:
		return nil, net.ErrClosed
	default:
	}
	ep, wq, terr := l.ep.Accept(nil)
	if terr != nil {
		return nil, errors.New(terr.String())
	}
	ep.SocketOptions().SetReceiveBufferSize(dnsBufSize, true)
	ep.SocketOptions().SetSendBufferSize(dnsBufSize, true)
	return gonet.NewTCPConn(wq, ep), nil
}

func (l *dnsListener) close() {
	l.once.Do(func() {
		close(l.done)
		l.ep.Close()
	})
}

// drainDNSTCP takes every connection waiting on l, then returns.
func (st *Stack) drainDNSTCP(l *dnsListener, sem chan struct{}) {
	for {
		c, err := l.acceptNow()
		if err != nil {
			return
		}
		select {
		case st.dnsConns <- struct{}{}:
		default:
			st.opts.Shared.stats.dnsTCPRefused.Add(1)
			c.Close()
			continue
		}
		if !st.track(c) {
			c.Close()
			<-st.dnsConns
			return
		}
		go func() {
			defer func() { <-st.dnsConns }()
			defer st.untrack(c)
			defer c.Close()
			st.serveDNSConn(c, sem)
		}()
	}
}

// serveDNSConn answers the queries of one connection in order, one at a
// time: a client that pipelines queries has at most one being resolved,
// and the rest wait in its own send buffer and the connection's receive
// buffer, both bounded.
func (st *Stack) serveDNSConn(c *gonet.TCPConn, sem chan struct{}) {
	msg := make([]byte, 1<<16)
	for {
		c.SetReadDeadline(time.Now().Add(dnsIdle))
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		q := msg[:binary.BigEndian.Uint16(l[:])]
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		if !st.dnsQueries.Allow() {
			st.opts.Shared.stats.dnsLimited.Add(1)
			ctx, cancel := context.WithTimeout(st.ctx, dnsWriteTimeout)
			err := st.dnsQueries.Wait(ctx)
			cancel()
			if err != nil {
				return
			}
		}
		sem <- struct{}{}
		resp := st.resolve(q, addrPortOf(c.RemoteAddr()), c.LocalAddr(), "tcp")
		<-sem
		if resp == nil {
			return
		}
		out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(resp)), uint16(len(resp)))
		c.SetWriteDeadline(time.Now().Add(dnsWriteTimeout))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

func (st *Stack) resolve(q []byte, src netip.AddrPort, local net.Addr, transport string) []byte {
	start := time.Now()
	resp, res := st.resolver.Resolve(st.ctx, q)
	ev := FlowEvent{
		Proto: "dns", Src: src, Dst: addrPortOf(local), Name: res.Name,
		Allowed: res.Allowed, Reason: res.Reason, Answers: res.Answers,
		Start: start, Duration: time.Since(start),
	}
	if res.Type != "" {
		ev.Rule = res.Type + " " + res.Rcode // e.g. "A NOERROR"
	}
	if res.Reason == dns.ReasonUnreachable {
		ev.Err = fmt.Sprintf("dropped never-reachable answers %v", res.Dropped)
	}
	st.record(ev)
	return resp
}

func addrPortOf(a net.Addr) netip.AddrPort {
	switch v := a.(type) {
	case *net.UDPAddr:
		return v.AddrPort()
	case *net.TCPAddr:
		return v.AddrPort()
	}
	return netip.AddrPort{}
}
