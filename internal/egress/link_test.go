package egress

import (
	"context"
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/time/rate"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"

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

// TestCheckVnetHdr: of the headers a device with IFF_VNET_HDR puts before
// a packet, only those of a whole packet with complete checksums pass; a
// claim of segmentation offload or of a partial checksum is refused
// whatever its other fields say, and DATA_VALID buys nothing.
func TestCheckVnetHdr(t *testing.T) {
	tests := []struct {
		name string
		hdr  []byte
		want bool
	}{
		{"plain", make([]byte, 10), true},
		{"data valid", []byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 0}, true},
		{"needs csum", []byte{1, 0, 0, 0, 0, 0, 20, 0, 16, 0}, false},
		{"needs csum and data valid", []byte{3, 0, 0, 0, 0, 0, 20, 0, 16, 0}, false},
		{"gso tcpv4", []byte{0, 1, 40, 0, 0x40, 0x05, 0, 0, 0, 0}, false},
		{"gso tcpv6", []byte{0, 4, 60, 0, 0x40, 0x05, 0, 0, 0, 0}, false},
		{"gso udp", []byte{0, 3, 0, 0, 0, 0, 0, 0, 0, 0}, false},
		{"gso ecn only", []byte{0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0}, false},
		{"gso huge sizes", []byte{0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, false},
		{"short", []byte{0, 0, 0}, false},
	}
	for _, tt := range tests {
		if got := checkVnetHdr(tt.hdr); got != tt.want {
			t.Errorf("checkVnetHdr(%s) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestPartialChecksum checks the packets the link hands the sandbox's
// kernel with a partial checksum: completed as the kernel completes one
// (the sum from csum_start to the end, complemented, at csum_offset), the
// TCP or UDP checksum is valid.
func TestPartialChecksum(t *testing.T) {
	payload := make([]byte, 1001)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	src4, dst4 := toTCPIP(SandboxIPv4.Addr()), toTCPIP(netip.MustParseAddr("203.0.113.5"))
	src6, dst6 := toTCPIP(SandboxIPv6.Addr()), toTCPIP(netip.MustParseAddr("2001:db8::5"))
	for _, tt := range []struct {
		name     string
		v6       bool
		proto    tcpip.TransportProtocolNumber
		src, dst tcpip.Address
	}{
		{"tcp4", false, header.TCPProtocolNumber, dst4, src4},
		{"udp4", false, header.UDPProtocolNumber, dst4, src4},
		{"tcp6", true, header.TCPProtocolNumber, dst6, src6},
		{"udp6", true, header.UDPProtocolNumber, dst6, src6},
	} {
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{ReserveHeaderBytes: 80, Payload: buffer.MakeWithData(payload)})
		tlen := len(payload)
		if tt.proto == header.TCPProtocolNumber {
			tlen += header.TCPMinimumSize
			header.TCP(pkt.TransportHeader().Push(header.TCPMinimumSize)).Encode(&header.TCPFields{
				SrcPort: 80, DstPort: 40000, SeqNum: 7, AckNum: 9, DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagAck, WindowSize: 1000,
			})
		} else {
			tlen += header.UDPMinimumSize
			header.UDP(pkt.TransportHeader().Push(header.UDPMinimumSize)).Encode(&header.UDPFields{SrcPort: 53, DstPort: 40000, Length: uint16(tlen)})
		}
		pkt.TransportProtocolNumber = tt.proto
		if tt.v6 {
			header.IPv6(pkt.NetworkHeader().Push(header.IPv6MinimumSize)).Encode(&header.IPv6Fields{
				PayloadLength: uint16(tlen), TransportProtocol: tt.proto, HopLimit: 64, SrcAddr: tt.src, DstAddr: tt.dst,
			})
			pkt.NetworkProtocolNumber = header.IPv6ProtocolNumber
		} else {
			header.IPv4(pkt.NetworkHeader().Push(header.IPv4MinimumSize)).Encode(&header.IPv4Fields{
				TotalLength: uint16(header.IPv4MinimumSize + tlen), TTL: 64, Protocol: uint8(tt.proto), SrcAddr: tt.src, DstAddr: tt.dst,
			})
			pkt.NetworkProtocolNumber = header.IPv4ProtocolNumber
		}
		h := partialChecksum(pkt)
		if h[0] != vnetFlagNeedsCsum || h[1] != vnetGSONone {
			t.Fatalf("%s: header %v, want NEEDS_CSUM and no GSO", tt.name, h)
		}
		b := pkt.ToView().AsSlice()
		start, off := int(binary.NativeEndian.Uint16(h[6:])), int(binary.NativeEndian.Uint16(h[8:]))
		sum := ^checksum.Checksum(b[start:], 0)
		binary.BigEndian.PutUint16(b[start+off:], sum)
		seg := b[start:]
		var ok bool
		if tt.proto == header.TCPProtocolNumber {
			ok = header.TCP(seg).IsChecksumValid(tt.src, tt.dst, checksum.Checksum(payload, 0), uint16(len(payload)))
		} else {
			ok = header.UDP(seg).IsChecksumValid(tt.src, tt.dst, checksum.Checksum(payload, 0))
		}
		if !ok {
			t.Errorf("%s: completed checksum invalid", tt.name)
		}
		pkt.DecRef()
	}
}

// recordingDispatcher records the first payload byte of every packet the
// filter delivers, in order.
type recordingDispatcher struct {
	mu  sync.Mutex
	got []byte
}

func (d *recordingDispatcher) DeliverNetworkPacket(_ tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, pkt.Data().AsRange().ToSlice()[header.IPv4MinimumSize+header.TCPMinimumSize])
}

func (d *recordingDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

func (d *recordingDispatcher) delivered() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return string(d.got)
}

// sandboxTCP is a TCP packet from the sandbox carrying the byte b.
func sandboxTCP(b byte) *stack.PacketBuffer {
	buf := make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize+1)
	header.IPv4(buf).Encode(&header.IPv4Fields{
		TotalLength: uint16(len(buf)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber),
		SrcAddr: toTCPIP(SandboxIPv4.Addr()), DstAddr: toTCPIP(netip.MustParseAddr("203.0.113.1")),
	})
	buf[len(buf)-1] = b
	return stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(buf)})
}

// TestDeliveriesHeld: while a write holds deliveries, the sandbox's
// packets pass the filter but reach the stack only when it ends, in the
// order they came and before any that comes after.
func TestDeliveriesHeld(t *testing.T) {
	var paced atomic.Int64
	fep := newFilterEndpoint(context.Background(), channel.New(4, DefaultMTU, ""), rate.NewLimiter(rate.Inf, 1), &paced)
	d := &recordingDispatcher{}
	fep.Attach(d)
	deliver := func(b byte) {
		pkt := sandboxTCP(b)
		fep.DeliverNetworkPacket(header.IPv4ProtocolNumber, pkt)
		pkt.DecRef()
	}
	deliver('a')
	fep.holdDeliveries()
	deliver('b')
	deliver('c')
	if got := d.delivered(); got != "a" {
		t.Fatalf("delivered %q while a write held deliveries, want %q", got, "a")
	}
	fep.releaseDeliveries()
	deliver('d')
	if got := d.delivered(); got != "abcd" {
		t.Fatalf("delivered %q, want %q", got, "abcd")
	}
}
