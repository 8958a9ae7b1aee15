package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/fencesandbox/fence/internal/egress/policy"
)

// Proxy is a SOCKS5 proxy (RFC 1928) a sandbox's allowed TCP flows are
// tunnelled through, with username/password authentication (RFC 1929)
// when Username is set. Only CONNECT is used; UDP (DNS, QUIC) is not
// tunnelled.
//
// It fails closed: when the proxy cannot be reached, does not speak
// SOCKS5, refuses the credentials or the CONNECT, the flow fails. A flow
// never falls back to a direct connection.
//
// The password lives only in daemon memory: String and the API never show
// it.
type Proxy struct {
	// Address is "host:port"; host is an address or a DNS name.
	Address  string
	Username string
	Password string
	// Allowed, if set, must accept every address Address resolves to, or
	// the dial fails: a name rebound to an internal address after it was
	// validated is not dialed.
	Allowed func(netip.Addr) bool
	// Lookup resolves the host of Address; nil means net.DefaultResolver.
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
}

// String shows the address and the user, never the password.
func (p *Proxy) String() string {
	if p.Username != "" {
		return "socks5://" + p.Username + "@" + p.Address
	}
	return "socks5://" + p.Address
}

// defaultSOCKSTimeout bounds the proxy handshake when ctx has no deadline.
const defaultSOCKSTimeout = 10 * time.Second

// SOCKS5 constants (RFC 1928, RFC 1929).
const (
	socksVersion     = 0x05
	socksNoAuth      = 0x00
	socksUserPass    = 0x02
	socksNoMethod    = 0xff
	socksConnect     = 0x01
	socksATYPv4      = 0x01
	socksATYPDomain  = 0x03
	socksATYPv6      = 0x04
	socksAuthVersion = 0x01
)

var socksReplies = [...]string{
	1: "general SOCKS server failure",
	2: "connection not allowed by ruleset",
	3: "network unreachable",
	4: "host unreachable",
	5: "connection refused",
	6: "TTL expired",
	7: "command not supported",
	8: "address type not supported",
}

// ErrProxy wraps every failure of the egress proxy.
var ErrProxy = errors.New("egress proxy")

func proxyErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrProxy, fmt.Sprintf(format, args...))
}

// Dial opens a CONNECT tunnel through p to name:port (ATYP domain: the
// proxy resolves name) when name is set, else to dst's address. dial
// connects to the proxy itself. The handshake is bounded by ctx's
// deadline (10 s without one); the returned connection has no deadline.
func (p *Proxy) Dial(ctx context.Context, dial DialFunc, name string, dst netip.AddrPort) (net.Conn, error) {
	if len(name) > 255 {
		return nil, proxyErr("name %q is too long for SOCKS5", name)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultSOCKSTimeout)
		defer cancel()
	}
	c, err := p.connect(ctx, dial)
	if err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	// A canceled ctx ends the handshake at once.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	err = p.handshake(c, name, dst)
	if !stop() || err != nil {
		c.Close()
		if err == nil {
			err = proxyErr("%v", ctx.Err())
		}
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// connect resolves the proxy's address, checks every address it resolves
// to, and connects to the first that answers.
func (p *Proxy) connect(ctx context.Context, dial DialFunc) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(p.Address)
	if err != nil {
		return nil, proxyErr("address %q: %v", p.Address, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, proxyErr("address %q: bad port", p.Address)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		lookup := p.Lookup
		if lookup == nil {
			lookup = func(ctx context.Context, h string) ([]netip.Addr, error) {
				return net.DefaultResolver.LookupNetIP(ctx, "ip", h)
			}
		}
		addrs, err = lookup(ctx, host)
		if err != nil {
			return nil, proxyErr("resolving %s: %v", host, err)
		}
		if len(addrs) == 0 {
			return nil, proxyErr("%s has no address", host)
		}
	}
	for _, a := range addrs {
		if p.Allowed != nil && !p.Allowed(a) {
			return nil, proxyErr("%s resolves to %s, an internal address", host, a)
		}
	}
	var errs []error
	for _, a := range addrs {
		c, err := dial(ctx, "tcp", netip.AddrPortFrom(a.Unmap(), uint16(port)).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, proxyErr("connecting to %s: %v", p.Address, errors.Join(errs...))
}

// handshake has the SOCKS5 proxy on c connect to dst (by name when there
// is one), authenticating when p has a username.
func (p *Proxy) handshake(c net.Conn, name string, dst netip.AddrPort) error {
	method := byte(socksNoAuth)
	if p.Username != "" {
		method = socksUserPass
	}
	if err := p.greet(c, method); err != nil {
		return err
	}
	if method == socksUserPass {
		if err := p.authenticate(c); err != nil {
			return err
		}
	}
	if _, err := c.Write(connectRequest(name, dst)); err != nil {
		return proxyErr("connect: %v", err)
	}
	return p.readConnectReply(c)
}

// greet offers the one authentication method and checks that the proxy
// chose it.
func (p *Proxy) greet(c net.Conn, method byte) error {
	if _, err := c.Write([]byte{socksVersion, 1, method}); err != nil {
		return proxyErr("greeting: %v", err)
	}
	var b [2]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return proxyErr("greeting: %v", err)
	}
	switch {
	case b[0] != socksVersion:
		return proxyErr("%s does not speak SOCKS5", p.Address)
	case b[1] == socksNoMethod:
		return proxyErr("%s accepts none of the offered authentication methods", p.Address)
	case b[1] != method:
		return proxyErr("%s chose authentication method %d, which was not offered", p.Address, b[1])
	}
	return nil
}

// authenticate sends the username and password (RFC 1929), clearing its
// copy of them, and checks that the proxy accepted them.
func (p *Proxy) authenticate(c net.Conn) error {
	if len(p.Username) > 255 || len(p.Password) > 255 {
		return proxyErr("credentials longer than 255 bytes")
	}
	msg := make([]byte, 0, 3+len(p.Username)+len(p.Password))
	msg = append(msg, socksAuthVersion, byte(len(p.Username)))
	msg = append(msg, p.Username...)
	msg = append(msg, byte(len(p.Password)))
	msg = append(msg, p.Password...)
	_, err := c.Write(msg)
	clear(msg)
	if err != nil {
		return proxyErr("authentication: %v", err)
	}
	var b [2]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return proxyErr("authentication: %v", err)
	}
	if b[0] != socksAuthVersion || b[1] != 0 {
		return proxyErr("%s refused the credentials of user %q", p.Address, p.Username)
	}
	return nil
}

// connectRequest is the CONNECT to dst: by name when there is one, so
// that the proxy resolves it, else by address.
func connectRequest(name string, dst netip.AddrPort) []byte {
	req := []byte{socksVersion, socksConnect, 0}
	switch a := dst.Addr().Unmap(); {
	case name != "":
		req = append(req, socksATYPDomain, byte(len(name)))
		req = append(req, name...)
	case a.Is4():
		v := a.As4()
		req = append(req, socksATYPv4)
		req = append(req, v[:]...)
	default:
		v := a.As16()
		req = append(req, socksATYPv6)
		req = append(req, v[:]...)
	}
	return binary.BigEndian.AppendUint16(req, dst.Port())
}

// readConnectReply reads the reply to the CONNECT, to its end, and gives
// the proxy's refusal as an error.
func (p *Proxy) readConnectReply(c net.Conn) error {
	var head [4]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return proxyErr("connect reply: %v", err)
	}
	if head[0] != socksVersion {
		return proxyErr("connect reply: version %d", head[0])
	}
	if rep := head[1]; rep != 0 {
		msg := "unknown error"
		if int(rep) < len(socksReplies) && socksReplies[rep] != "" {
			msg = socksReplies[rep]
		}
		return proxyErr("%s refused the connection: %s (%d)", p.Address, msg, rep)
	}
	var skip int
	switch head[3] {
	case socksATYPv4:
		skip = 4
	case socksATYPv6:
		skip = 16
	case socksATYPDomain:
		var l [1]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return proxyErr("connect reply: %v", err)
		}
		skip = int(l[0])
	default:
		return proxyErr("connect reply: address type %d", head[3])
	}
	// The bound address and port are of no use here.
	if _, err := io.CopyN(io.Discard, c, int64(skip+2)); err != nil {
		return proxyErr("connect reply: %v", err)
	}
	return nil
}

// SetProxy replaces the egress proxy for new flows (nil: connect
// directly). Flows already open keep their connection.
func (st *Stack) SetProxy(p *Proxy) { st.proxy.Store(p) }

// dialUpstream connects an allowed flow to dst: directly, or through the
// sandbox's egress proxy, by name (remote DNS) when the flow was allowed
// for a name.
func (st *Stack) dialUpstream(ctx context.Context, dst netip.AddrPort, d policy.Decision) (net.Conn, error) {
	p := st.proxy.Load()
	if p == nil {
		return st.dial(ctx, "tcp", dst.String())
	}
	name := ""
	if d.Reason == policy.ReasonAllowName {
		name = d.Name
	}
	return p.Dial(ctx, st.dial, name, dst)
}
