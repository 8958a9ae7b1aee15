package egress

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"

	"github.com/fencesandbox/fence/internal/egress/dns"
)

const maxDNSInFlight = 64

// serveDNS listens on the resolver addresses, UDP and TCP port 53.
func (st *Stack) serveDNS() error {
	sem := make(chan struct{}, maxDNSInFlight)
	for _, a := range []netip.Addr{ResolverIPv4, ResolverIPv6} {
		proto := ipv4.ProtocolNumber
		if a.Is6() {
			proto = ipv6.ProtocolNumber
		}
		fa := tcpip.FullAddress{NIC: nicID, Addr: toTCPIP(a), Port: 53}
		uc, err := gonet.DialUDP(st.s, &fa, nil, proto)
		if err != nil {
			return fmt.Errorf("listening on %v udp/53: %w", a, err)
		}
		tl, err := gonet.ListenTCP(st.s, fa, proto)
		if err != nil {
			uc.Close()
			return fmt.Errorf("listening on %v tcp/53: %w", a, err)
		}
		st.wg.Add(3)
		go func() {
			defer st.wg.Done()
			<-st.ctx.Done()
			uc.Close()
			tl.Close()
		}()
		go func() {
			defer st.wg.Done()
			st.serveDNSUDP(uc, sem)
		}()
		go func() {
			defer st.wg.Done()
			st.serveDNSTCP(tl, sem)
		}()
	}
	return nil
}

func (st *Stack) serveDNSUDP(uc *gonet.UDPConn, sem chan struct{}) {
	for {
		buf := make([]byte, 1500)
		n, from, err := uc.ReadFrom(buf)
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // overloaded: drop, the client retries
		}
		go func() {
			defer func() { <-sem }()
			resp := st.resolve(buf[:n], addrPortOf(from), uc.LocalAddr(), "udp")
			if resp != nil {
				uc.WriteTo(resp, from)
			}
		}()
	}
}

func (st *Stack) serveDNSTCP(l *gonet.TCPListener, sem chan struct{}) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		if !st.acquire() {
			c.Close()
			continue
		}
		if !st.track(c) {
			c.Close()
			st.release()
			return
		}
		go func() {
			defer st.release()
			defer st.untrack(c)
			defer c.Close()
			for {
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				msg := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, msg); err != nil {
					return
				}
				sem <- struct{}{}
				resp := st.resolve(msg, addrPortOf(c.RemoteAddr()), c.LocalAddr(), "tcp")
				<-sem
				if resp == nil {
					return
				}
				out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(resp)), uint16(len(resp)))
				if _, err := c.Write(append(out, resp...)); err != nil {
					return
				}
			}
		}()
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
