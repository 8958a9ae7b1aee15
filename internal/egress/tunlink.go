package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// tunLink is the stack's link endpoint on a sandbox's TUN device. It reads
// the device through the Go runtime's network poller: an idle sandbox
// costs one parked goroutine, no OS thread blocked in a read, and no packet
// buffer (one is taken from gVisor's buffer pool only once the device is
// readable, and given back if the read finds nothing). Packets are
// delivered on the reading goroutine, so the stack reads no faster than it
// handles them and the packet rate limit paces the reads themselves.
//
// On a device made with IFF_VNET_HDR (tun.Config.VnetHdr), every
// packet carries a virtio-net header. The stack then leaves out the TCP
// and UDP checksums of the packets it sends to the sandbox: the link
// writes the pseudo-header sum and marks the packet's checksum partial
// (VIRTIO_NET_HDR_F_NEEDS_CSUM), which the sandbox's kernel takes as
// verified, as for any packet made on its own host. Nothing but memory
// lies between the two stacks, so computing a checksum over every byte on
// one side and verifying it on the other bought nothing. In the other
// direction nothing in the header is trusted: a packet that claims
// segmentation offload (GSO) or a partial checksum is dropped (the device
// is given no offloads, so its kernel never produces either), and every
// packet's checksums are verified by the stack (unless
// Options.TrustChecksums), since a process in the sandbox able to write
// raw packets could write any.
//
// It owns the device's fd from newTunLink on: Close closes it (which
// removes the device, the sandbox's netns permitting).
type tunLink struct {
	f     *os.File
	rc    syscall.RawConn
	mtu   uint32
	vnet  bool // the device carries virtio-net headers
	trust bool // received checksums are not verified (Options.TrustChecksums)

	mu sync.Mutex
	// +checklocks:mu
	dispatcher stack.NetworkDispatcher
	// +checklocks:mu
	stopping bool
	// +checklocks:mu
	onClose func()
	// +checklocks:mu
	closed bool

	wg sync.WaitGroup // the reading goroutine
}

var _ stack.LinkEndpoint = (*tunLink)(nil)

// newTunLink takes ownership of fd, a TUN device (IFF_TUN|IFF_NO_PI). On
// error fd is closed.
func newTunLink(fd int, mtu uint32, trustChecksums bool) (*tunLink, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("making the TUN fd non-blocking: %w", err)
	}
	ifr, err := unix.NewIfreq("")
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("reading the TUN device's flags: %w", err)
	}
	flags := ifr.Uint16()
	if flags&unix.IFF_TUN == 0 || flags&unix.IFF_NO_PI == 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("the device is not an IFF_TUN|IFF_NO_PI device (flags %#x)", flags)
	}
	f := os.NewFile(uintptr(fd), "tun") // non-blocking: registered with the poller
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &tunLink{f: f, rc: rc, mtu: mtu, vnet: flags&unix.IFF_VNET_HDR != 0, trust: trustChecksums}, nil
}

// The virtio-net header (struct virtio_net_hdr, without the v1 field)
// that a device with IFF_VNET_HDR puts before every packet.
const (
	vnetHdrLen        = 10
	vnetFlagNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
	vnetGSONone       = 0 // VIRTIO_NET_HDR_GSO_NONE
)

// checkVnetHdr reports whether a packet read from the device with header h
// is one the stack takes: a whole packet with complete checksums. The
// header's other fields (header and segment sizes, checksum offsets) only
// mean something with GSO or a partial checksum, both refused; a
// DATA_VALID flag is ignored (the stack verifies the checksums itself).
func checkVnetHdr(h []byte) bool {
	if len(h) < vnetHdrLen {
		return false
	}
	return h[1] == vnetGSONone && h[0]&vnetFlagNeedsCsum == 0
}

// partialChecksum prepares pkt, whose transport checksum the stack left
// out, for the sandbox's kernel: it writes the pseudo-header sum into the
// TCP or UDP checksum field and returns the virtio-net header that tells
// the kernel where the checksum is (a partial checksum, which its
// receive path takes as verified). Other packets (the stack checksums
// them itself) get a header with no flags.
func partialChecksum(pkt *stack.PacketBuffer) [vnetHdrLen]byte {
	var h [vnetHdrLen]byte
	var src, dst tcpip.Address
	var netLen int
	switch pkt.NetworkProtocolNumber {
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(pkt.NetworkHeader().Slice())
		if len(ip) < header.IPv4MinimumSize {
			return h
		}
		src, dst, netLen = ip.SourceAddress(), ip.DestinationAddress(), len(ip)
	case header.IPv6ProtocolNumber:
		ip := header.IPv6(pkt.NetworkHeader().Slice())
		if len(ip) < header.IPv6MinimumSize {
			return h
		}
		src, dst, netLen = ip.SourceAddress(), ip.DestinationAddress(), len(ip)
	default:
		return h
	}
	th := pkt.TransportHeader().Slice()
	var off int
	switch pkt.TransportProtocolNumber {
	case header.TCPProtocolNumber:
		if len(th) < header.TCPMinimumSize {
			return h
		}
		off = header.TCPChecksumOffset
	case header.UDPProtocolNumber:
		if len(th) < header.UDPMinimumSize {
			return h
		}
		off = 6 // the UDP checksum field
	default:
		return h
	}
	// The transport length: its header and everything after it.
	tlen := pkt.Size() - len(pkt.LinkHeader().Slice()) - netLen
	xsum := header.PseudoHeaderChecksum(pkt.TransportProtocolNumber, src, dst, uint16(tlen))
	binary.BigEndian.PutUint16(th[off:], xsum)
	h[0] = vnetFlagNeedsCsum
	binary.NativeEndian.PutUint16(h[6:], uint16(netLen)) // csum_start (legacy virtio: native order)
	binary.NativeEndian.PutUint16(h[8:], uint16(off))    // csum_offset
	return h
}

// read delivers the device's packets until Attach(nil) or Close.
//
// It reads into a buffer of the device's MTU taken from gVisor's pool
// (which zeroes it) when the device is readable. A small packet (an
// acknowledgement, most of what a download sends back) is copied out and
// the buffer kept for the next read, so that a busy device does not zero
// 64 KiB per acknowledgement; a large one is delivered in the buffer
// itself. The buffer is given back as soon as the device has nothing to
// read: an idle sandbox's link holds none.
func (l *tunLink) read() {
	defer l.wg.Done()
	var v *buffer.View // the read buffer, held only while the device has packets
	defer func() {
		if v != nil {
			v.Release()
		}
	}()
	hdr := 0
	if l.vnet {
		hdr = vnetHdrLen
	}
	for {
		var n int
		var rerr error
		err := l.rc.Read(func(fd uintptr) bool {
			if v == nil {
				v = buffer.NewViewSize(hdr + int(l.mtu))
			}
			n, rerr = unix.Read(int(fd), v.AsSlice())
			if rerr == unix.EAGAIN {
				// Nothing to read: hold no buffer while waiting.
				v.Release()
				v = nil
				return false
			}
			return true
		})
		if err != nil {
			// Closed, or stopped by a deadline (Attach(nil)).
			if errors.Is(err, os.ErrDeadlineExceeded) && !l.isStopping() {
				continue
			}
			return
		}
		if rerr != nil || n <= 0 {
			if rerr == unix.EINTR {
				continue
			}
			// EBADFD or EIO: the device is gone with the sandbox's netns.
			return
		}
		var pv *buffer.View
		switch {
		case hdr > 0 && (n < hdr || !checkVnetHdr(v.AsSlice()[:hdr])):
		case n-hdr <= int(l.mtu)/2:
			// A buffer of the device's MTU (64 KiB) would stay pinned by
			// this packet wherever the stack queues it: a flood of small
			// packets would cost 64 KiB each. Copy it into one of its
			// size, and keep the read buffer.
			pv = buffer.NewViewWithData(v.AsSlice()[hdr:n])
		default:
			pv, v = v, nil
			pv.CapLength(n)
			pv.TrimFront(hdr)
		}
		if pv != nil {
			l.deliver(pv)
		}
	}
}

// deliver hands the packet in pv (an IP packet, without the virtio-net
// header) to the stack.
func (l *tunLink) deliver(pv *buffer.View) {
	var proto tcpip.NetworkProtocolNumber
	switch header.IPVersion(pv.AsSlice()) {
	case header.IPv4Version:
		proto = header.IPv4ProtocolNumber
	case header.IPv6Version:
		proto = header.IPv6ProtocolNumber
	default:
		pv.Release()
		return
	}
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithView(pv)})
	l.mu.Lock()
	d := l.dispatcher
	l.mu.Unlock()
	if d != nil {
		d.DeliverNetworkPacket(proto, pkt)
	}
	pkt.DecRef()
}

// stop stops the reading goroutine and waits for it. The stack's Wait
// waits for its links holding the stack's lock, which a packet being
// delivered may need (a reply's route): the owner stops the reader first,
// holding no lock of the stack.
func (l *tunLink) stop() {
	l.mu.Lock()
	l.stopping = true
	l.mu.Unlock()
	l.f.SetReadDeadline(time.Unix(1, 0))
	l.wg.Wait()
}

func (l *tunLink) isStopping() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopping
}

// WritePackets implements stack.LinkWriter: one write(2) per packet (a
// TUN device takes one packet per write), through the poller's reference
// on the fd, so that a concurrent Close cannot hand the number to another
// file meanwhile.
func (l *tunLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	sent := 0
	for _, pkt := range pkts.AsSlice() {
		iov := pkt.AsSlices()
		if l.vnet {
			h := partialChecksum(pkt)
			iov = append([][]byte{h[:]}, iov...)
		}
		var werr error
		err := l.rc.Write(func(fd uintptr) bool {
			_, werr = unix.Writev(int(fd), iov)
			return werr != unix.EAGAIN
		})
		if err != nil {
			return sent, &tcpip.ErrClosedForSend{}
		}
		if werr != nil {
			if werr == unix.EIO || werr == unix.EBADFD {
				return sent, &tcpip.ErrClosedForSend{}
			}
			// Dropped by the device (as a full queue would): the
			// transport retransmits.
		}
		sent++
	}
	return sent, nil
}

// Attach implements stack.NetworkLinkEndpoint. A nil dispatcher (the NIC
// being removed) stops the reading goroutine without waiting for it: the
// stack detaches a link holding its own lock, and a packet the reader is
// delivering at that moment may need that lock (a reply's route), so a
// wait here deadlocked the sandbox's teardown. Close and Wait wait for it;
// a packet delivered meanwhile reaches a disabled NIC and is dropped.
func (l *tunLink) Attach(d stack.NetworkDispatcher) {
	l.mu.Lock()
	if d == nil {
		running := l.dispatcher != nil
		l.dispatcher = nil
		l.stopping = true
		l.mu.Unlock()
		if running {
			l.f.SetReadDeadline(time.Unix(1, 0))
		}
		return
	}
	start := l.dispatcher == nil && !l.stopping && !l.closed
	l.dispatcher = d
	l.mu.Unlock()
	if start {
		l.wg.Add(1)
		go l.read()
	}
}

// IsAttached implements stack.NetworkLinkEndpoint.
func (l *tunLink) IsAttached() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dispatcher != nil
}

// Close implements stack.NetworkLinkEndpoint: it closes the device's fd.
func (l *tunLink) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.stopping = true
	onClose := l.onClose
	l.mu.Unlock()
	l.f.Close()
	l.wg.Wait()
	if onClose != nil {
		onClose()
	}
}

// Wait implements stack.NetworkLinkEndpoint.
func (l *tunLink) Wait() { l.wg.Wait() }

// SetOnCloseAction implements stack.NetworkLinkEndpoint.
func (l *tunLink) SetOnCloseAction(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onClose = f
}

// MTU implements stack.NetworkLinkEndpoint.
func (l *tunLink) MTU() uint32 { return l.mtu }

// SetMTU implements stack.NetworkLinkEndpoint; the device's MTU is fixed.
func (l *tunLink) SetMTU(uint32) {}

// MaxHeaderLength implements stack.NetworkLinkEndpoint: a TUN device has
// no link header.
func (l *tunLink) MaxHeaderLength() uint16 { return 0 }

// LinkAddress implements stack.NetworkLinkEndpoint.
func (l *tunLink) LinkAddress() tcpip.LinkAddress { return "" }

// SetLinkAddress implements stack.NetworkLinkEndpoint.
func (l *tunLink) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.NetworkLinkEndpoint. Received packets'
// checksums are verified unless Options.TrustChecksums (see tunLink); with
// virtio-net headers the stack leaves out the transport checksums of what
// it sends.
func (l *tunLink) Capabilities() stack.LinkEndpointCapabilities {
	var c stack.LinkEndpointCapabilities
	if l.vnet {
		c |= stack.CapabilityTXChecksumOffload
	}
	if l.trust {
		c |= stack.CapabilityRXChecksumOffload
	}
	return c
}

// ARPHardwareType implements stack.NetworkLinkEndpoint.
func (l *tunLink) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.NetworkLinkEndpoint.
func (l *tunLink) AddHeader(*stack.PacketBuffer) {}

// ParseHeader implements stack.NetworkLinkEndpoint.
func (l *tunLink) ParseHeader(*stack.PacketBuffer) bool { return true }
