package egress

import (
	"context"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// DialDirect is the stack's upstream dial when Options.Dial is nil (a
// DialFunc that redirects can end in it): a net.Dialer's, but a
// connection that is established by the time connect(2) returns (an
// upstream on the host or in a namespace beside it: the kernel answers
// the SYN inside the call and finishes the handshake as it returns) is
// taken as it is. Go's dialer always parks the dialing goroutine on the
// network poller after a non-blocking connect, and it runs again only
// once a thread has polled the network and the scheduler has found it a
// CPU: on a busy machine a wait of its own on the path of every new
// connection, before its SYN-ACK. Here the dialer's socket is connected
// by its Control hook, before the dialer's own connect, and checked once
// without waiting (poll(2) with no timeout): an established socket's
// connect(2) then answers EISCONN, which the dialer takes as connected
// without parking; one still under way (any upstream beyond the host)
// answers EALREADY, and the dialer waits on the poller as it would have,
// its context watched as always. The socket is the dialer's own from the
// start: no descriptor is duplicated and none registered with the poller
// twice (a connection built from a file, net.FileConn, cost six system
// calls more per dial). The connection is a *net.TCPConn set up by the
// dialer (no Nagle, keep-alive every 15 s); errors are a net.Dialer's
// ("dial tcp ADDR: connect: connection refused", "i/o timeout").
// Anything but a TCP dial to an address and port goes to a plain
// net.Dialer.
func DialDirect(ctx context.Context, network, address string) (net.Conn, error) {
	if _, err := netip.ParseAddrPort(address); err != nil || (network != "tcp" && network != "tcp4" && network != "tcp6") {
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
	d := net.Dialer{ControlContext: connectFirst}
	return d.DialContext(ctx, network, address)
}

// connectFirst is DialDirect's Control hook: it connects the dialer's
// socket to address before the dialer does, and counts a connection that
// was established at once. An error (a refusal found by the check)
// fails the dial as the dialer's connect would have.
func connectFirst(ctx context.Context, network, address string, c syscall.RawConn) error {
	dst, err := netip.ParseAddrPort(address)
	if err != nil {
		return nil // the dialer connects as usual
	}
	// The dialer's socket is IPv4 for an IPv4 address (mapped or not)
	// unless the network is "tcp6".
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()}
	if a := dst.Addr().Unmap(); a.Is4() && network != "tcp6" {
		sa = &unix.SockaddrInet4{Port: int(dst.Port()), Addr: a.As4()}
	}
	var cerr error
	if err := c.Control(func(fd uintptr) {
		switch err := unix.Connect(int(fd), sa); err {
		case nil:
			dialsAtOnce.Add(1)
		case unix.EINPROGRESS, unix.EINTR:
			var done bool
			if done, cerr = connectDone(int(fd)); done && cerr == nil {
				dialsAtOnce.Add(1)
			}
		default:
			cerr = os.NewSyscallError("connect", err)
		}
	}); err != nil {
		return err
	}
	return cerr
}

// dialsAtOnce counts the dials of DialDirect whose connection was
// established without waiting (for tests).
var dialsAtOnce atomic.Int64

// connectDone reports whether fd's non-blocking connect has ended, and
// its error if it failed, without waiting.
func connectDone(fd int) (bool, error) {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	if n, err := unix.Poll(p, 0); err != nil || n == 0 {
		return false, nil
	}
	soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return true, os.NewSyscallError("getsockopt", err)
	}
	if soErr != 0 {
		return true, os.NewSyscallError("connect", unix.Errno(soErr))
	}
	return true, nil
}
