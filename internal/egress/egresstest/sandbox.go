package egresstest

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/pipe"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/fencesandbox/fence/internal/egress"
)

// Sandbox plays the sandbox side of an egress stack: a second netstack
// with the sandbox's addresses and default routes over an in-memory link.
type Sandbox struct {
	S *stack.Stack
}

// NewLink returns the two ends of an in-memory layer-3 link: pass the
// first as egress.Options.Link and the second to NewSandbox.
func NewLink(mtu uint32) (stackSide, sandboxSide stack.LinkEndpoint) {
	a, b := pipe.New("", "", mtu)
	return a, b
}

// NewSandbox builds the sandbox-side stack on link. It is closed when the
// test ends.
func NewSandbox(t testing.TB, link stack.LinkEndpoint) *Sandbox {
	t.Helper()
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	})
	for _, o := range []tcpip.SettableTransportProtocolOption{
		ptr(tcpip.TCPSACKEnabled(true)),
		ptr(tcpip.TCPModerateReceiveBufferOption(true)),
		&tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: 1 << 20, Max: 8 << 20},
		&tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: 1 << 20, Max: 8 << 20},
	} {
		s.SetTransportProtocolOption(tcp.ProtocolNumber, o)
	}
	if err := s.CreateNIC(1, link); err != nil {
		t.Fatalf("creating sandbox NIC: %s", err)
	}
	for _, p := range []netip.Prefix{egress.SandboxIPv4, egress.SandboxIPv6} {
		proto := ipv4.ProtocolNumber
		if p.Addr().Is6() {
			proto = ipv6.ProtocolNumber
		}
		pa := tcpip.ProtocolAddress{Protocol: proto, AddressWithPrefix: tcpip.AddressWithPrefix{Address: addr(p.Addr()), PrefixLen: p.Bits()}}
		if err := s.AddProtocolAddress(1, pa, stack.AddressProperties{}); err != nil {
			t.Fatalf("adding sandbox address: %s", err)
		}
	}
	s.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: 1},
		{Destination: header.IPv6EmptySubnet, NIC: 1},
	})
	t.Cleanup(func() { s.Close(); s.Wait() })
	return &Sandbox{S: s}
}

func ptr[T any](v T) *T { return &v }

func addr(a netip.Addr) tcpip.Address {
	if a.Is4() {
		return tcpip.AddrFrom4(a.As4())
	}
	return tcpip.AddrFrom16(a.As16())
}

func proto(a netip.Addr) tcpip.NetworkProtocolNumber {
	if a.Is4() {
		return ipv4.ProtocolNumber
	}
	return ipv6.ProtocolNumber
}

// DialTCP connects from the sandbox to dst.
func (sb *Sandbox) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	return gonet.DialContextTCP(ctx, sb.S, tcpip.FullAddress{NIC: 1, Addr: addr(dst.Addr()), Port: dst.Port()}, proto(dst.Addr()))
}

// DialUDP opens a UDP socket in the sandbox connected to dst.
func (sb *Sandbox) DialUDP(dst netip.AddrPort) (net.Conn, error) {
	return gonet.DialUDP(sb.S, nil, &tcpip.FullAddress{NIC: 1, Addr: addr(dst.Addr()), Port: dst.Port()}, proto(dst.Addr()))
}

// ListenTCP listens on the sandbox's IPv4 address.
func (sb *Sandbox) ListenTCP(port uint16) (net.Listener, error) {
	return gonet.ListenTCP(sb.S, tcpip.FullAddress{NIC: 1, Addr: addr(egress.SandboxIPv4.Addr()), Port: port}, ipv4.ProtocolNumber)
}

// Resolver returns a net.Resolver that sends the sandbox's queries to the
// egress stack's resolver over the in-memory link.
func (sb *Sandbox) Resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		dst := netip.AddrPortFrom(egress.ResolverIPv4, 53)
		if network == "tcp" || network == "tcp4" || network == "tcp6" {
			return sb.DialTCP(ctx, dst)
		}
		return sb.DialUDP(dst)
	}}
}

// Recorder collects FlowEvents.
type Recorder struct {
	mu     sync.Mutex
	events []egress.FlowEvent
}

// Record implements egress.Recorder.
func (r *Recorder) Record(_ context.Context, ev egress.FlowEvent) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
}

// Events returns the events so far.
func (r *Recorder) Events() []egress.FlowEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]egress.FlowEvent(nil), r.events...)
}
