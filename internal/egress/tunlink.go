package egress

import (
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
// It owns the device's fd from newTunLink on: Close closes it (which
// removes the device, the sandbox's netns permitting).
type tunLink struct {
	f   *os.File
	rc  syscall.RawConn
	mtu uint32

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
func newTunLink(fd int, mtu uint32) (*tunLink, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("making the TUN fd non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(fd), "tun") // non-blocking: registered with the poller
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &tunLink{f: f, rc: rc, mtu: mtu}, nil
}

// read delivers the device's packets until Attach(nil) or Close.
func (l *tunLink) read() {
	defer l.wg.Done()
	for {
		var v *buffer.View
		var n int
		var rerr error
		err := l.rc.Read(func(fd uintptr) bool {
			if v == nil {
				v = buffer.NewViewSize(int(l.mtu))
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
			if v != nil {
				v.Release()
			}
			if errors.Is(err, os.ErrDeadlineExceeded) && !l.isStopping() {
				continue
			}
			return
		}
		if rerr != nil || n <= 0 {
			v.Release()
			if rerr == unix.EINTR {
				continue
			}
			// EBADFD or EIO: the device is gone with the sandbox's netns.
			return
		}
		if n <= int(l.mtu)/2 {
			// A buffer of the device's MTU (64 KiB) would stay pinned by
			// this packet wherever the stack queues it: a flood of small
			// packets would cost 64 KiB each. Copy it into one of its size.
			small := buffer.NewViewWithData(v.AsSlice()[:n])
			v.Release()
			v = small
		} else {
			v.CapLength(n)
		}
		var proto tcpip.NetworkProtocolNumber
		switch header.IPVersion(v.AsSlice()) {
		case header.IPv4Version:
			proto = header.IPv4ProtocolNumber
		case header.IPv6Version:
			proto = header.IPv6ProtocolNumber
		default:
			v.Release()
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithView(v)})
		l.mu.Lock()
		d := l.dispatcher
		l.mu.Unlock()
		if d != nil {
			d.DeliverNetworkPacket(proto, pkt)
		}
		pkt.DecRef()
	}
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
// being removed) stops the reading goroutine and waits for it.
func (l *tunLink) Attach(d stack.NetworkDispatcher) {
	l.mu.Lock()
	if d == nil {
		running := l.dispatcher != nil
		l.dispatcher = nil
		l.stopping = true
		l.mu.Unlock()
		if running {
			l.f.SetReadDeadline(time.Unix(1, 0))
			l.wg.Wait()
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

// Capabilities implements stack.NetworkLinkEndpoint: the sandbox's kernel
// builds the packets the device delivers, so their checksums are not
// checked again.
func (l *tunLink) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityRXChecksumOffload
}

// ARPHardwareType implements stack.NetworkLinkEndpoint.
func (l *tunLink) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.NetworkLinkEndpoint.
func (l *tunLink) AddHeader(*stack.PacketBuffer) {}

// ParseHeader implements stack.NetworkLinkEndpoint.
func (l *tunLink) ParseHeader(*stack.PacketBuffer) bool { return true }
