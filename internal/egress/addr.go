package egress

import (
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// The fixed addressing between a sandbox and its stack. Every sandbox uses
// the same addresses: they exist only on the TUN link, never on the host.
var (
	// SandboxIPv4 is the address (and prefix) of the sandbox's TUN device.
	SandboxIPv4 = netip.MustParsePrefix("10.0.2.100/24")
	// SandboxIPv6 is the IPv6 address (and prefix) of the sandbox's TUN device.
	SandboxIPv6 = netip.MustParsePrefix("fd00:fe11:ce::100/64")
	// GatewayIPv4 and GatewayIPv6 belong to the stack; ingress connections
	// come from them.
	GatewayIPv4 = netip.MustParseAddr("10.0.2.2")
	GatewayIPv6 = netip.MustParseAddr("fd00:fe11:ce::2")
	// ResolverIPv4 and ResolverIPv6 are the sandbox's DNS server (port 53).
	ResolverIPv4 = netip.MustParseAddr("10.0.2.3")
	ResolverIPv6 = netip.MustParseAddr("fd00:fe11:ce::3")
)

// DefaultMTU is the TUN MTU the stack assumes when Options.MTU is 0. A large
// MTU (as slirp4netns uses) cuts per-packet cost; TUN is point-to-point, so
// nothing else on the link needs to agree.
const DefaultMTU = 65520

func toTCPIP(a netip.Addr) tcpip.Address {
	if a.Is4() {
		return tcpip.AddrFrom4(a.As4())
	}
	return tcpip.AddrFrom16(a.As16())
}

func fromTCPIP(a tcpip.Address) netip.Addr {
	switch a.Len() {
	case 4:
		return netip.AddrFrom4(a.As4())
	case 16:
		return netip.AddrFrom16(a.As16())
	}
	return netip.Addr{}
}
