package egress

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDialDirect: a dial to a listener on the host's loopback is
// established inside connect(2) and taken without waiting; the connection
// works both ways and is set up as a net.Dialer's; a refused dial reads
// as a net.Dialer's error.
func TestDialDirect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n0 := dialsAtOnce.Load()
	c, err := DialDirect(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := dialsAtOnce.Load() - n0; n != 1 {
		t.Errorf("%d of 1 loopback dials taken at once, want 1 (the dial waited on the poller)", n)
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		t.Fatalf("the connection is a %T, want a *net.TCPConn", c)
	}
	if c.RemoteAddr().String() != ln.Addr().String() {
		t.Errorf("remote address %v, want %v", c.RemoteAddr(), ln.Addr())
	}
	rc, _ := tc.SyscallConn()
	rc.Control(func(fd uintptr) {
		if v, _ := unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NODELAY); v == 0 {
			t.Error("Nagle's algorithm left on")
		}
		if v, _ := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE); v == 0 {
			t.Error("no keep-alive")
		}
	})
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo = %q, %v", buf, err)
	}

	// A closed port: refused, as a net.Dialer says it.
	free, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := free.Addr().String()
	free.Close()
	_, err = DialDirect(ctx, "tcp", addr)
	if err == nil || !strings.Contains(err.Error(), "dial tcp "+addr+": connect: connection refused") || !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("dial of a closed port: %v, want a net.Dialer's connection refused", err)
	}
}

// TestDialDirectWaits: a connection not established inside connect(2)
// (the listener's queue is full, so its SYN is dropped and sent again)
// waits on the poller until it is, or until the context's deadline, which
// reads as a net.Dialer's timeout.
func TestDialDirectWaits(t *testing.T) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "listener")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	// Fill the accept queue (a backlog of 0 holds one).
	var fill []net.Conn
	defer func() {
		for _, c := range fill {
			c.Close()
		}
	}()
	for range 2 {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			fill = append(fill, c)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = DialDirect(ctx, "tcp", addr)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "i/o timeout") {
		t.Fatalf("dial to a full queue within 300 ms: %v, want a timeout", err)
	}

	// Waiting, and then accepted: the SYN sent again finds room.
	n0 := dialsAtOnce.Load()
	type result struct {
		c   net.Conn
		err error
	}
	res := make(chan result, 1)
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		c, err := DialDirect(ctx, "tcp", addr)
		res <- result{c, err}
	}()
	time.Sleep(100 * time.Millisecond)
	for range fill {
		a, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("dial after the queue had room: %v", r.err)
	}
	r.c.Close()
	if n := dialsAtOnce.Load() - n0; n != 0 {
		t.Errorf("a dial that waited for its SYN to be sent again counted as taken at once")
	}
}

// TestDialDirectSyscalls: a dial established at once is the dialer's own
// socket, connected and checked: no descriptor duplicated (fcntl), none
// registered with the poller and taken off it again (epoll_ctl), no
// second close. It was built from a file (net.FileConn): 19 system calls
// for its socket against 13.
func TestDialDirectSyscalls(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dial := func() {
		c, err := DialDirect(ctx, "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	n0 := dialsAtOnce.Load()
	// The calls a dial makes for its socket (counted by name: the
	// runtime's own calls on the thread, preemption signals and
	// wake-ups, vary with the machine's load).
	names := []string{"socket", "connect", "ppoll", "getsockopt", "setsockopt", "getsockname", "getpeername", "fcntl", "epoll_ctl", "close", "dup", "dup3"}
	n := countSyscalls(t, names, dial)
	if dialsAtOnce.Load()-n0 != 1 {
		t.Fatal("the loopback dial was not taken at once")
	}
	total := uint64(0)
	for _, c := range n {
		total += c
	}
	t.Logf("system calls of one dial: %d, %v", total, n)
	if n["fcntl"] != 0 || n["epoll_ctl"] != 1 || n["close"] != 0 {
		t.Errorf("a dial made %d fcntl, %d epoll_ctl and %d close calls, want 0, 1 and 0 (one socket, registered once)", n["fcntl"], n["epoll_ctl"], n["close"])
	}
	if total > 13 {
		t.Errorf("a dial made %d system calls for its socket, want at most 13", total)
	}
}
