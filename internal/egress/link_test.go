package egress

import (
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

func TestAcceptPacketIPv4(t *testing.T) {
	tests := []struct {
		name   string
		proto  uint8
		flags  uint8
		offset uint16
		want   bool
	}{
		{"tcp", uint8(header.TCPProtocolNumber), 0, 0, true},
		{"udp", uint8(header.UDPProtocolNumber), 0, 0, true},
		{"icmp", uint8(header.ICMPv4ProtocolNumber), 0, 0, false},
		{"first fragment", uint8(header.TCPProtocolNumber), header.IPv4FlagMoreFragments, 0, false},
		{"last fragment", uint8(header.UDPProtocolNumber), 0, 64, false},
	}
	for _, tt := range tests {
		b := make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize)
		header.IPv4(b).Encode(&header.IPv4Fields{
			TotalLength: uint16(len(b)), TTL: 64, Protocol: tt.proto, Flags: tt.flags, FragmentOffset: tt.offset,
			SrcAddr: toTCPIP(SandboxIPv4.Addr()), DstAddr: toTCPIP(ResolverIPv4),
		})
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
		if got := acceptPacket(header.IPv4ProtocolNumber, pkt); got != tt.want {
			t.Errorf("acceptPacket(%s) = %v, want %v", tt.name, got, tt.want)
		}
		pkt.DecRef()
	}
}
