// Package tun creates the sandbox end of the egress link: a TUN device in
// a sandbox's network namespace, configured with the addresses and default
// routes of package egress, whose fd the daemon hands to egress.New.
//
// # What it guarantees
//
//   - The device is created non-persistent from the daemon's fd: closing
//     the fd (egress.Stack.Close) removes the device, and so does removing
//     the namespace; nothing is left on the host.
//   - The fd is close-on-exec. The calling goroutine's thread is returned to
//     the daemon's namespace, or, if that fails, the thread is discarded.
//   - Configuration uses rtnetlink from Go; no ip(8) is spawned.
//   - The device has no offloads enabled; with Config.VnetHdr it carries
//     virtio-net headers (IFF_VNET_HDR).
//
// # What it does not do
//
// It does not create the namespace, write resolv.conf (point it at
// egress.ResolverIPv4/IPv6), or add firewall rules: the TUN device is the
// namespace's only interface besides loopback, and the stack behind it
// decides.
package tun

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Config describes the sandbox side.
type Config struct {
	Name string         // interface name (default "eth0")
	MTU  uint32         // default 65520
	Addr []netip.Prefix // addresses, e.g. egress.SandboxIPv4, egress.SandboxIPv6
	// VnetHdr makes the device carry a virtio-net header before every
	// packet (IFF_VNET_HDR), with which egress's link hands the
	// sandbox's kernel packets whose checksum is left partial. Only for
	// a device the sandbox's kernel stack reads: a packet socket on it
	// (a user-space stack such as runsc's) would see such checksums
	// unfinished.
	VnetHdr bool
}

// Create creates and configures the TUN device in the network namespace
// nsPath ("/proc/PID/ns/net", "/run/netns/NAME" or "/proc/self/fd/N") and
// returns its fd, which the caller owns. It also brings up loopback.
func Create(nsPath string, cfg Config) (fd int, err error) {
	if cfg.Name == "" {
		cfg.Name = "eth0"
	}
	if cfg.MTU == 0 {
		cfg.MTU = 65520
	}
	ns, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening netns %s: %w", nsPath, err)
	}
	defer unix.Close(ns)

	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("opening own netns: %w", err)
	}
	defer unix.Close(orig)
	if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("entering netns %s: %w", nsPath, err)
	}
	defer func() {
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else: leave the thread locked; it exits with the goroutine.
	}()

	fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(cfg.Name)
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("interface name %q: %w", cfg.Name, err)
	}
	flags := uint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if cfg.VnetHdr {
		// 10 bytes before every packet, which egress's link reads and
		// writes. No offload is enabled (TUNSETOFFLOAD): what the device
		// gives the daemon is always whole packets with complete
		// checksums.
		flags |= unix.IFF_VNET_HDR
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("creating TUN %s: %w", cfg.Name, err)
	}
	if err := configure(cfg); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func configure(cfg Config) error {
	nl, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("opening rtnetlink: %w", err)
	}
	defer unix.Close(nl)
	if err := unix.Bind(nl, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("binding rtnetlink: %w", err)
	}
	lo, err := ifindex("lo")
	if err != nil {
		return err
	}
	idx, err := ifindex(cfg.Name)
	if err != nil {
		return err
	}
	rt := &rtnl{fd: nl}
	if err := rt.linkUp(lo, 0); err != nil {
		return fmt.Errorf("bringing up lo: %w", err)
	}
	if err := rt.linkUp(idx, cfg.MTU); err != nil {
		return fmt.Errorf("bringing up %s: %w", cfg.Name, err)
	}
	for _, p := range cfg.Addr {
		if err := rt.addAddr(idx, p); err != nil {
			return fmt.Errorf("adding address %v: %w", p, err)
		}
		if err := rt.defaultRoute(idx, family(p.Addr())); err != nil {
			return fmt.Errorf("adding default route for %v: %w", p, err)
		}
	}
	return nil
}

// rtnl is a bound rtnetlink socket that sends one request at a time.
type rtnl struct {
	fd  int
	seq uint32
}

// request sends a message of type typ (body, then attrs) and waits for
// its acknowledgement, giving the kernel's error.
func (r *rtnl) request(typ uint16, flags uint16, body []byte, attrs ...[]byte) error {
	r.seq++
	msg := make([]byte, unix.NLMSG_HDRLEN, 256)
	msg = append(msg, body...)
	for _, a := range attrs {
		msg = append(msg, a...)
	}
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], r.seq)
	if err := unix.Sendto(r.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(r.fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscallParse(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != r.seq || m.Header.Type != unix.NLMSG_ERROR {
				continue
			}
			if errno := int32(binary.NativeEndian.Uint32(m.Data[:4])); errno != 0 {
				return unix.Errno(-errno)
			}
			return nil
		}
	}
}

// linkUp brings interface index up, setting its MTU when mtu is not 0.
func (r *rtnl) linkUp(index int, mtu uint32) error {
	body := make([]byte, unix.SizeofIfInfomsg)
	ifi := (*unix.IfInfomsg)(unsafe.Pointer(&body[0]))
	ifi.Family = unix.AF_UNSPEC
	ifi.Index = int32(index)
	ifi.Flags = unix.IFF_UP
	ifi.Change = unix.IFF_UP
	var attrs [][]byte
	if mtu != 0 {
		attrs = append(attrs, attr(unix.IFLA_MTU, binary.NativeEndian.AppendUint32(nil, mtu)))
	}
	return r.request(unix.RTM_NEWLINK, 0, body, attrs...)
}

// addAddr gives interface index the address p (an IPv6 one without
// duplicate address detection).
func (r *rtnl) addAddr(index int, p netip.Prefix) error {
	body := make([]byte, unix.SizeofIfAddrmsg)
	ifa := (*unix.IfAddrmsg)(unsafe.Pointer(&body[0]))
	ifa.Family = family(p.Addr())
	ifa.Prefixlen = uint8(p.Bits())
	ifa.Index = uint32(index)
	attrs := [][]byte{attr(unix.IFA_LOCAL, p.Addr().AsSlice()), attr(unix.IFA_ADDRESS, p.Addr().AsSlice())}
	if p.Addr().Is6() {
		ifa.Flags = unix.IFA_F_NODAD
		attrs = append(attrs, attr(unix.IFA_FLAGS, binary.NativeEndian.AppendUint32(nil, unix.IFA_F_NODAD)))
	}
	return r.request(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body, attrs...)
}

// defaultRoute sets the default route of family fam through interface
// index.
func (r *rtnl) defaultRoute(index int, fam uint8) error {
	rb := make([]byte, unix.SizeofRtMsg)
	rt := (*unix.RtMsg)(unsafe.Pointer(&rb[0]))
	rt.Family = fam
	rt.Table = unix.RT_TABLE_MAIN
	rt.Protocol = unix.RTPROT_BOOT
	rt.Scope = unix.RT_SCOPE_UNIVERSE
	rt.Type = unix.RTN_UNICAST
	return r.request(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, rb,
		attr(unix.RTA_OIF, binary.NativeEndian.AppendUint32(nil, uint32(index))))
}

func family(a netip.Addr) uint8 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func attr(typ uint16, data []byte) []byte {
	l := unix.SizeofRtAttr + len(data)
	b := make([]byte, (l+3)&^3)
	binary.NativeEndian.PutUint16(b[0:], uint16(l))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[unix.SizeofRtAttr:], data)
	return b
}

func ifindex(name string) (int, error) {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("opening socket: %w", err)
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, fmt.Errorf("looking up %s: %w", name, err)
	}
	return int(ifr.Uint32()), nil
}

type nlMsg struct {
	Header unix.NlMsghdr
	Data   []byte
}

func syscallParse(b []byte) ([]nlMsg, error) {
	var out []nlMsg
	for len(b) >= unix.NLMSG_HDRLEN {
		var h unix.NlMsghdr
		h.Len = binary.NativeEndian.Uint32(b[0:])
		h.Type = binary.NativeEndian.Uint16(b[4:])
		h.Flags = binary.NativeEndian.Uint16(b[6:])
		h.Seq = binary.NativeEndian.Uint32(b[8:])
		h.Pid = binary.NativeEndian.Uint32(b[12:])
		if h.Len < unix.NLMSG_HDRLEN || int(h.Len) > len(b) {
			return nil, os.ErrInvalid
		}
		out = append(out, nlMsg{Header: h, Data: b[unix.NLMSG_HDRLEN:h.Len]})
		b = b[(h.Len+3)&^3:]
	}
	return out, nil
}
