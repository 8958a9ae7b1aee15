package probe

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"
)

// agentPort is envd's port, the one an agent that listens on its
// sandbox's network uses (fence's boot.Port: this package imports nothing
// of fence's).
const agentPort = 49983

// checkAgentReach connects to the agent's port ([PORT], default 49983) on
// loopback and on every address of the sandbox's interfaces and, wherever
// a connection opens, asks for /bin/true to be started as root through
// envd's process API. Any HTTP answer is an escape: the agent serves its
// supervisor alone, as the daemon's access checks and the template's sudo
// rules would mean nothing otherwise.
func checkAgentReach(args []string) error {
	port := uint16(agentPort)
	switch len(args) {
	case 0:
	case 1:
		p, err := strconv.ParseUint(args[0], 10, 16)
		if err != nil || p == 0 {
			return fmt.Errorf("%w: bad PORT %q", errUsage, args[0])
		}
		port = uint16(p)
	default:
		return fmt.Errorf("%w: want at most one PORT", errUsage)
	}
	addrs := []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()}
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return fmt.Errorf("listing the sandbox's addresses: %w", err)
	}
	for _, ia := range ifaddrs {
		n, ok := ia.(*net.IPNet)
		if !ok {
			continue
		}
		a, ok := netip.AddrFromSlice(n.IP)
		if !ok || a.IsLinkLocalUnicast() { // link-local needs a zone, and the agent is not on one
			continue
		}
		addrs = append(addrs, a.Unmap())
	}
	seen := map[netip.Addr]bool{}
	for _, a := range addrs {
		if seen[a] {
			continue
		}
		seen[a] = true
		if err := askAgent(netip.AddrPortFrom(a, port)); err != nil {
			return err
		}
	}
	return nil
}

// askAgent asks whatever listens at ap to start /bin/true as root, as an
// envd client would (a Connect server-streaming call, JSON), and reports
// an escape if it gets an HTTP answer. A refused, reset or silent
// connection is a refusal.
func askAgent(ap netip.AddrPort) error {
	c, err := net.DialTimeout("tcp", ap.String(), dialTimeout)
	if err != nil {
		return nil
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(dialTimeout))
	msg := []byte(`{"process":{"cmd":"/bin/true"}}`)
	body := make([]byte, 5, 5+len(msg)) // Connect envelope: flags, length
	binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
	body = append(body, msg...)
	req := fmt.Sprintf("POST /process.Process/Start HTTP/1.1\r\nHost: %s\r\n"+
		"Content-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\n"+
		"Authorization: Basic cm9vdDo=\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", ap, len(body))
	if _, err := c.Write(append([]byte(req), body...)); err != nil {
		return nil
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return escapef("the agent at %s took a request to start /bin/true as root", ap)
	}
	return escapef("the agent at %s answered: %s", ap, resp.Status)
}
