package tun_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
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

// pathEnv is a namespace whose only interface is a TUN device served by a
// stack that allows 203.0.113.0/24 and dials every allowed flow to a
// server on the host's loopback (counting the dials).
type pathEnv struct {
	ns     int
	nsPath string
	st     *egress.Stack
	dials  atomic.Int64
	ln     net.Listener
}

func newPathEnv(t testing.TB, vnet bool, serve func(net.Conn)) *pathEnv {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root: creates a network namespace and a TUN device")
	}
	e := &pathEnv{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.ln = ln
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	e.ns = newNetns(t)
	e.nsPath = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), e.ns)
	fd, err := tun.Create(e.nsPath, tun.Config{Addr: []netip.Prefix{egress.SandboxIPv4, egress.SandboxIPv6}, VnetHdr: vnet})
	if err != nil {
		t.Fatalf("tun.Create: %v", err)
	}
	p, err := policy.Compile(policy.Spec{Allow: []policy.Rule{{Prefix: netip.MustParsePrefix("203.0.113.0/24")}}})
	if err != nil {
		t.Fatal(err)
	}
	e.st, err = egress.New(context.Background(), egress.Options{
		SandboxID: "pathtest", FD: fd, Policy: p, DNSUpstream: "127.0.0.1:9",
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			e.dials.Add(1)
			return egress.DialDirect(ctx, network, ln.Addr().String())
		},
	})
	if err != nil {
		t.Fatalf("egress.New: %v", err)
	}
	t.Cleanup(func() { e.st.Close() })
	return e
}

// rawSYN is an IPv4 TCP SYN from the sandbox's address to dst, with a
// correct TCP checksum unless bad.
func rawSYN(srcPort uint16, dst netip.AddrPort, bad bool) []byte {
	b := make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize)
	src := tcpip.AddrFrom4(egress.SandboxIPv4.Addr().As4())
	dstA := tcpip.AddrFrom4(dst.Addr().As4())
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(b)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber),
		SrcAddr: src, DstAddr: dstA,
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	tcp := header.TCP(b[header.IPv4MinimumSize:])
	tcp.Encode(&header.TCPFields{
		SrcPort: srcPort, DstPort: dst.Port(), SeqNum: 1000, DataOffset: header.TCPMinimumSize,
		Flags: header.TCPFlagSyn, WindowSize: 65535,
	})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dstA, header.TCPMinimumSize)
	sum := ^checksum.Checksum(tcp, xsum)
	if bad {
		sum ^= 0x5a5a
	}
	tcp.SetChecksum(sum)
	return b
}

// TestTUNVerifiesChecksums writes TCP SYNs with raw sockets inside the
// namespace, as a sandbox process able to write raw packets could: the
// stack must verify the checksums of what it reads from the device (it
// cannot know who made a packet), so a SYN with a wrong TCP checksum to an
// allowed destination makes no flow and no dial, and the same SYN with
// the right checksum does.
func TestTUNVerifiesChecksums(t *testing.T) {
	for _, vnet := range []bool{false, true} {
		t.Run(fmt.Sprintf("vnet=%v", vnet), func(t *testing.T) { testVerifiesChecksums(t, vnet) })
	}
}

func testVerifiesChecksums(t *testing.T, vnet bool) {
	e := newPathEnv(t, vnet, func(c net.Conn) { io.Copy(io.Discard, c) })
	dst := netip.MustParseAddrPort("203.0.113.7:80")
	for i := range 3 {
		sendRaw(t, e.ns, dst, 0, rawSYN(40000+uint16(i), dst, true))
	}
	time.Sleep(time.Second)
	if n := e.dials.Load(); n != 0 {
		t.Fatalf("SYNs with a wrong TCP checksum made %d upstream dials, want 0", n)
	}
	sendRaw(t, e.ns, dst, 0, rawSYN(40010, dst, false))
	deadline := time.Now().Add(5 * time.Second)
	for e.dials.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := e.dials.Load(); n != 1 {
		t.Fatalf("a SYN with the right checksum made %d upstream dials, want 1 (the raw socket path works)", n)
	}
}

// sendRaw sends the IPv4 packets pkts to dst through a raw socket in the
// network namespace ns, gap apart.
func sendRaw(t *testing.T, ns int, dst netip.AddrPort, gap time.Duration, pkts ...[]byte) {
	t.Helper()
	inNetns(t, ns, func() {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			t.Errorf("raw socket: %v", err)
			return
		}
		defer unix.Close(fd)
		for _, pkt := range pkts {
			if err := unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()}); err != nil {
				t.Errorf("sendto: %v", err)
				return
			}
			time.Sleep(gap)
		}
	})
}

// TestTUNVerifiesChecksumsDuringDownload is TestTUNVerifiesChecksums with
// the SYNs written while a download runs: the link then reads a busy
// device, keeping its read buffer from one packet to the next, and the
// SYNs arrive among the download's acknowledgements; they too must have
// their checksums verified.
func TestTUNVerifiesChecksumsDuringDownload(t *testing.T) {
	e := newPathEnv(t, true, func(c net.Conn) {
		buf := make([]byte, 256<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	dst := netip.MustParseAddrPort("203.0.113.7:80")
	var c net.Conn
	var err error
	inNetns(t, e.ns, func() { c, err = net.DialTimeout("tcp", dst.String(), 5*time.Second) })
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	done := make(chan int64)
	go func() {
		n, _ := io.Copy(io.Discard, c)
		done <- n
	}()
	var syns [][]byte
	for i := range 200 {
		syns = append(syns, rawSYN(41000+uint16(i), dst, true))
	}
	sendRaw(t, e.ns, dst, 2*time.Millisecond, syns...)
	time.Sleep(500 * time.Millisecond)
	c.SetReadDeadline(time.Now())
	n := <-done
	t.Logf("downloaded %d MiB meanwhile", n>>20)
	if n == 0 {
		t.Fatal("the download moved nothing")
	}
	if d := e.dials.Load(); d != 1 {
		t.Fatalf("%d upstream dials, want 1 (the download's): SYNs with a wrong TCP checksum made flows", d)
	}
}

// TestTUNBulkIntegrity downloads and uploads data through the device's
// whole path (the sandbox's kernel TCP, the device with its virtio-net
// headers and partial checksums, or without them, the stack, the relay)
// and checks every byte arrives unchanged, in both directions, on IPv4 and
// IPv6.
func TestTUNBulkIntegrity(t *testing.T) {
	for _, vnet := range []bool{false, true} {
		t.Run(fmt.Sprintf("vnet=%v", vnet), func(t *testing.T) { testBulkIntegrity(t, vnet) })
	}
}

func testBulkIntegrity(t *testing.T, vnet bool) {
	const size = 24<<20 + 12345 // not a multiple of any segment or buffer
	pattern := func(w io.Writer, n int64) {
		buf := make([]byte, 64<<10)
		var off int64
		for off < n {
			for i := range buf {
				buf[i] = byte((off + int64(i)) * 2654435761 >> 13)
			}
			k := min(int64(len(buf)), n-off)
			if _, err := w.Write(buf[:k]); err != nil {
				return
			}
			off += k
		}
	}
	want := sha256.New()
	pattern(want, size)
	wantSum := want.Sum(nil)
	got := make(chan []byte, 4)
	e := newPathEnv(t, vnet, func(c net.Conn) {
		var mode [1]byte
		if _, err := io.ReadFull(c, mode[:]); err != nil {
			return
		}
		if mode[0] == 'd' {
			pattern(c, size)
			return
		}
		h := sha256.New()
		n, _ := io.Copy(h, c)
		if n != size {
			got <- nil
			return
		}
		got <- h.Sum(nil)
	})
	for _, addr := range []string{"203.0.113.9:80", "[2001:db8::9]:80"} {
		if netip.MustParseAddrPort(addr).Addr().Is6() {
			// IPv6 destinations are allowed by their own rule.
			p, err := policy.Compile(policy.Spec{Allow: []policy.Rule{
				{Prefix: netip.MustParsePrefix("203.0.113.0/24")}, {Prefix: netip.MustParsePrefix("2001:db8::/64")}}})
			if err != nil {
				t.Fatal(err)
			}
			e.st.SetPolicy(p)
		}
		var c net.Conn
		var err error
		inNetns(t, e.ns, func() { c, err = net.DialTimeout("tcp", addr, 5*time.Second) })
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		c.SetDeadline(time.Now().Add(60 * time.Second))
		c.Write([]byte{'d'})
		h := sha256.New()
		n, err := io.Copy(h, c)
		c.Close()
		if err != nil || n != size || string(h.Sum(nil)) != string(wantSum) {
			t.Errorf("download via %s: %d bytes (want %d), err %v, same bytes: %v", addr, n, size, err, string(h.Sum(nil)) == string(wantSum))
		}

		inNetns(t, e.ns, func() { c, err = net.DialTimeout("tcp", addr, 5*time.Second) })
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		c.SetDeadline(time.Now().Add(60 * time.Second))
		c.Write([]byte{'u'})
		pattern(c, size)
		c.(*net.TCPConn).CloseWrite()
		select {
		case s := <-got:
			if string(s) != string(wantSum) {
				t.Errorf("upload via %s: the upstream got different bytes (or a different count)", addr)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("upload via %s: the upstream got no end", addr)
		}
		c.Close()
	}
}

// TestTUNDeviceFlags checks a device made with VnetHdr carries virtio-net
// headers of the size the link expects.
func TestTUNDeviceFlags(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: creates a network namespace and a TUN device")
	}
	ns := newNetns(t)
	fd, err := tun.Create(fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), ns), tun.Config{Addr: []netip.Prefix{egress.SandboxIPv4}, VnetHdr: true})
	if err != nil {
		t.Fatalf("tun.Create: %v", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		t.Fatal(err)
	}
	if f := ifr.Uint16(); f&unix.IFF_VNET_HDR == 0 || f&unix.IFF_NO_PI == 0 || f&unix.IFF_TUN == 0 {
		t.Errorf("device flags %#x, want IFF_TUN|IFF_NO_PI|IFF_VNET_HDR", f)
	}
	sz, err := unix.IoctlGetInt(fd, unix.TUNGETVNETHDRSZ)
	if err != nil {
		t.Fatal(err)
	}
	if sz != 10 {
		t.Errorf("virtio-net header size %d, want 10", sz)
	}
}
