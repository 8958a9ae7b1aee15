package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

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
// connection, before its SYN-ACK. Here the socket is checked once
// without waiting (poll(2) with no timeout); only a connection still
// under way (any upstream beyond the host) waits on the poller, its
// context watched by context.AfterFunc as Go's dialer does. The
// connection is a *net.TCPConn set up as a net.Dialer's (no Nagle,
// keep-alive every 15 s); errors read as a net.Dialer's ("dial tcp ADDR:
// connect: connection refused", "i/o timeout"). Anything but a TCP dial
// to an address and port goes to a net.Dialer.
func DialDirect(ctx context.Context, network, address string) (net.Conn, error) {
	dst, err := netip.ParseAddrPort(address)
	if err != nil || (network != "tcp" && network != "tcp4" && network != "tcp6") {
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: network, Addr: net.TCPAddrFromAddrPort(dst), Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, opErr(ctxErr(err))
	}
	family, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()})
	if a := dst.Addr(); a.Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: a.As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return nil, opErr(os.NewSyscallError("socket", err))
	}
	f := os.NewFile(uintptr(fd), "upstream") // non-blocking: on the poller
	defer f.Close()                          // net.FileConn keeps a copy
	done := false
	switch err := unix.Connect(fd, sa); err {
	case nil:
		done = true
	case unix.EINPROGRESS, unix.EINTR:
		if done, err = connectDone(fd); err != nil {
			return nil, opErr(err)
		}
	default:
		return nil, opErr(os.NewSyscallError("connect", err))
	}
	if done {
		dialsAtOnce.Add(1)
	} else if err := waitConnect(ctx, f); err != nil {
		return nil, opErr(err)
	}
	c, err := net.FileConn(f)
	if err != nil {
		return nil, opErr(err)
	}
	return c, nil
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

// waitConnect waits on the poller until f's connect ends, ctx ends, or
// ctx's deadline passes.
func waitConnect(ctx context.Context, f *os.File) error {
	if dl, ok := ctx.Deadline(); ok {
		f.SetWriteDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	werr := rc.Write(func(fd uintptr) bool {
		var done bool
		done, cerr = connectDone(int(fd))
		return done
	})
	switch {
	case cerr != nil:
		return cerr
	case werr == nil:
		return nil
	case ctx.Err() != nil:
		return ctxErr(ctx.Err())
	case errors.Is(werr, os.ErrDeadlineExceeded):
		return os.ErrDeadlineExceeded
	default:
		return werr
	}
}

// ctxErr is the dial error of a context's end, as a net.Dialer gives it.
func ctxErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return os.ErrDeadlineExceeded
	}
	return err
}
