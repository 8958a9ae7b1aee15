package egress

import (
	"context"
	"net/netip"
	"sync"
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
//
// Every TCP segment carrying data that the stack sends the sandbox earns
// it one packet past the rate (up to maxPaceCredit banked): the
// acknowledgement that segment calls for. A download's acknowledgements
// (one per one or two 64 KiB segments) would otherwise be what the rate
// bounds, capping a download near 1 GB/s, while the stack's work for them
// is smaller than the work of sending the data they answer. A flood
// gains nothing from it: past the rate, the sandbox sends at most one
// packet for every data segment the stack chose to send it.
//
// While a SYN-ACK (or a SYN) is written on its sender's goroutine, which
// holds the new endpoint's lock (see sendQueue), the packets the sandbox
// sends meanwhile pass the checks and the pacing as they come but reach
// the stack only once the write has ended, delivered in order by the
// writer (holdDeliveries, releaseDeliveries): the sandbox's kernel
// answers a SYN-ACK inside the write to its device, and gVisor's TCP
// processor, given that answer while the lock was held, retried the
// endpoint without pause until the write returned.
type filterEndpoint struct {
	nested.Endpoint
	ctx    context.Context
	pace   *rate.Limiter
	paced  *atomic.Int64
	credit atomic.Int64

	holdMu sync.Mutex
	// +checklocks:holdMu
	holding int // writes under way that hold deliveries
	// +checklocks:holdMu
	held  []heldPacket
	holds atomic.Int32 // holding, read without the lock
}

// heldPacket is a packet from the sandbox whose delivery waits for a
// write that holds deliveries.
type heldPacket struct {
	proto tcpip.NetworkProtocolNumber
	pkt   *stack.PacketBuffer
}

// maxPaceCredit bounds the packets a sandbox may bank past the packet
// rate: a segment window's worth of acknowledgements (a flow's send
// buffer holds at most 32 of the largest segments), for the flows a
// sandbox could have sending at once.
const maxPaceCredit = 1024

func newFilterEndpoint(ctx context.Context, child stack.LinkEndpoint, pace *rate.Limiter, paced *atomic.Int64) *filterEndpoint {
	e := &filterEndpoint{ctx: ctx, pace: pace, paced: paced}
	e.Endpoint.Init(child, e)
	return e
}

// DeliverNetworkPacket implements stack.NetworkDispatcher.
func (e *filterEndpoint) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	if !e.pace.Allow() && !e.spendCredit() {
		e.paced.Add(1)
		if e.pace.Wait(e.ctx) != nil {
			return // the stack is closing
		}
	}
	if !acceptPacket(proto, pkt) {
		return
	}
	if e.holds.Load() > 0 && e.hold(proto, pkt) {
		return
	}
	e.Endpoint.DeliverNetworkPacket(proto, pkt)
}

// hold keeps pkt for delivery once the writes that hold deliveries have
// ended, and reports whether it did (false: none is under way).
func (e *filterEndpoint) hold(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) bool {
	e.holdMu.Lock()
	defer e.holdMu.Unlock()
	if e.holding == 0 {
		return false
	}
	e.held = append(e.held, heldPacket{proto, pkt.IncRef()})
	return true
}

// holdDeliveries makes the sandbox's packets wait until the matching
// releaseDeliveries: a write that holds an endpoint's lock is under way.
func (e *filterEndpoint) holdDeliveries() {
	e.holdMu.Lock()
	e.holding++
	e.holds.Store(int32(e.holding))
	e.holdMu.Unlock()
}

// releaseDeliveries ends a holdDeliveries; the last one delivers what
// was held, in order, on the caller's goroutine (packets that come
// meanwhile are held behind them).
func (e *filterEndpoint) releaseDeliveries() {
	e.holdMu.Lock()
	for e.holding == 1 && len(e.held) > 0 {
		held := e.held
		e.held = nil
		e.holdMu.Unlock()
		for _, h := range held {
			e.Endpoint.DeliverNetworkPacket(h.proto, h.pkt)
			h.pkt.DecRef()
		}
		e.holdMu.Lock()
	}
	e.holding--
	e.holds.Store(int32(e.holding))
	e.holdMu.Unlock()
}

// spendCredit takes one packet of credit, if there is any.
func (e *filterEndpoint) spendCredit() bool {
	for {
		c := e.credit.Load()
		if c <= 0 {
			return false
		}
		if e.credit.CompareAndSwap(c, c-1) {
			return true
		}
	}
}

// WritePackets implements stack.LinkWriter: it credits the TCP segments
// with data among pkts (see filterEndpoint) and writes them.
func (e *filterEndpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	earned := int64(0)
	for _, pkt := range pkts.AsSlice() {
		if pkt.TransportProtocolNumber == header.TCPProtocolNumber && pkt.Data().Size() > 0 {
			earned++
		}
	}
	for earned > 0 {
		c := e.credit.Load()
		if c >= maxPaceCredit || e.credit.CompareAndSwap(c, min(c+earned, maxPaceCredit)) {
			break
		}
	}
	return e.Endpoint.WritePackets(pkts)
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
