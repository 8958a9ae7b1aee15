package tun_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/egress/tun"
)

// TestCloseUnderTraffic closes stacks while the namespace floods their
// devices with packets the stack answers (pings and SYNs to a denied
// address, whose replies need a route). Removing the stack's NIC holds the
// stack's lock while it detaches the link; a link that waited there for a
// reader delivering a packet that needs the same lock deadlocked the
// sandbox's teardown.
func TestCloseUnderTraffic(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: creates network namespaces and TUN devices")
	}
	p, err := policy.Compile(policy.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		ns := newNetns(t)
		path := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), ns)
		for _, vnet := range []bool{false, true} {
			fd, err := tun.Create(path, tun.Config{Addr: []netip.Prefix{egress.SandboxIPv4, egress.SandboxIPv6}, VnetHdr: vnet})
			if err != nil {
				t.Fatalf("tun.Create: %v", err)
			}
			st, err := egress.New(context.Background(), egress.Options{SandboxID: fmt.Sprintf("close%d", i), FD: fd, Policy: p, DNSUpstream: "127.0.0.1:9"})
			if err != nil {
				t.Fatalf("egress.New: %v", err)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for _, dst := range []netip.Addr{egress.GatewayIPv4, netip.MustParseAddr("203.0.113.1")} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					inNetns(t, ns, func() { flood(stop, dst) })
				}()
			}
			time.Sleep(30 * time.Millisecond)
			done := make(chan struct{})
			go func() { st.Close(); close(done) }()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				t.Fatalf("Close of a stack under traffic did not return in 20 s (vnet=%v, round %d)", vnet, i)
			}
			close(stop)
			wg.Wait()
			// A new device for the next round: the namespace keeps its own
			// only while the fd is open.
		}
	}
}

// flood sends ICMP echo requests and TCP SYNs to dst through a raw socket
// until stop is closed or the device is gone.
func flood(stop chan struct{}, dst netip.Addr) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	to := &unix.SockaddrInet4{Addr: dst.As4()}
	syn := rawSYN(40000, netip.AddrPortFrom(dst, 81), false)
	ping := rawPing(dst)
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		pkt := syn
		if n%2 == 1 {
			pkt = ping
		}
		if err := unix.Sendto(fd, pkt, 0, to); err != nil {
			time.Sleep(time.Millisecond)
		}
	}
}

// rawPing is an IPv4 ICMP echo request from the sandbox's address to dst.
func rawPing(dst netip.Addr) []byte {
	b := make([]byte, header.IPv4MinimumSize+header.ICMPv4MinimumSize+8)
	src := tcpip.AddrFrom4(egress.SandboxIPv4.Addr().As4())
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(b)), TTL: 64, Protocol: uint8(header.ICMPv4ProtocolNumber),
		SrcAddr: src, DstAddr: tcpip.AddrFrom4(dst.As4()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	icmp := header.ICMPv4(b[header.IPv4MinimumSize:])
	icmp.SetType(header.ICMPv4Echo)
	icmp.SetIdent(7)
	icmp.SetSequence(1)
	icmp.SetChecksum(^checksum.Checksum(icmp, 0))
	return b
}
