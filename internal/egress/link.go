package egress

import (
	"context"
	"net/netip"
	"sync/atomic"

	"golang.org/x/time/rate"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// filterEndpoint drops, before the stack sees them, packets the sandbox
// has no business sending: anything but TCP and UDP (ICMP included, so the
// stack never answers pings on behalf of the internet), IPv4 fragments,
// IPv6 packets with extension headers, and packets from a source outside the sandbox prefix
// or from one of the stack's own addresses.
//
// It also paces the sandbox: past the packet rate, DeliverNetworkPacket
// waits for the limiter on the link's reading goroutine, so the stack
// stops reading the TUN device and the sandbox's excess packets wait (or
// are dropped) in its own kernel instead of costing the daemon CPU.
type filterEndpoint struct {
	nested.Endpoint
	ctx   context.Context
	pace  *rate.Limiter
	paced *atomic.Int64
}

func newFilterEndpoint(ctx context.Context, child stack.LinkEndpoint, pace *rate.Limiter, paced *atomic.Int64) *filterEndpoint {
	e := &filterEndpoint{ctx: ctx, pace: pace, paced: paced}
	e.Endpoint.Init(child, e)
	return e
}

// DeliverNetworkPacket implements stack.NetworkDispatcher.
func (e *filterEndpoint) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	if !e.pace.Allow() {
		e.paced.Add(1)
		if e.pace.Wait(e.ctx) != nil {
			return // the stack is closing
		}
	}
	if !acceptPacket(proto, pkt) {
		return
	}
	e.Endpoint.DeliverNetworkPacket(proto, pkt)
}

func acceptPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) bool {
	switch proto {
	case header.IPv4ProtocolNumber:
		b, ok := pkt.Data().PullUp(header.IPv4MinimumSize)
		if !ok {
			return false
		}
		h := header.IPv4(b)
		if p := h.Protocol(); p != uint8(header.TCPProtocolNumber) && p != uint8(header.UDPProtocolNumber) {
			return false
		}
		// Fragments: nothing the sandbox needs sends them over a link with
		// a 64 KiB MTU, and reassembly would hold memory for it.
		if h.More() || h.FragmentOffset() != 0 {
			return false
		}
		src := netip.AddrFrom4(h.SourceAddress().As4())
		return SandboxIPv4.Contains(src) && src != GatewayIPv4 && src != ResolverIPv4
	case header.IPv6ProtocolNumber:
		b, ok := pkt.Data().PullUp(header.IPv6MinimumSize)
		if !ok {
			return false
		}
		h := header.IPv6(b)
		if p := h.NextHeader(); p != uint8(header.TCPProtocolNumber) && p != uint8(header.UDPProtocolNumber) {
			return false
		}
		src := netip.AddrFrom16(h.SourceAddress().As16())
		return SandboxIPv6.Contains(src) && src != GatewayIPv6 && src != ResolverIPv6
	}
	return false
}
