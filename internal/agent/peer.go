package agent

import (
	"net"
	"net/netip"
)

// OnlyFrom returns a listener that accepts, of ln's connections, only
// those whose remote address is peer (an IPv4-mapped IPv6 address counts
// as its IPv4 address). Every other connection is reset at once, before
// the agent reads a byte of it, and Accept goes on waiting; errors of ln
// are returned as they are.
//
// It is what keeps an agent listening on its sandbox's network for its
// supervisor alone: with peer the supervisor's end of that network, a
// process of the sandbox, which can only send from the sandbox's own
// addresses or loopback, never gets a request through.
func OnlyFrom(ln net.Listener, peer netip.Addr) net.Listener {
	return &peerListener{Listener: ln, peer: peer.Unmap()}
}

type peerListener struct {
	net.Listener
	peer netip.Addr
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if remoteIs(c, l.peer) {
			return c, nil
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, not an orderly close
		}
		c.Close()
	}
}

// remoteIs reports whether c's remote end is at address peer.
func remoteIs(c net.Conn, peer netip.Addr) bool {
	ta, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return false
	}
	return ta.AddrPort().Addr().Unmap() == peer
}
