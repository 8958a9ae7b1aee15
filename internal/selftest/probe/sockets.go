package probe

import (
	"fmt"
	"net"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// checkSockets checks the socket families and netlink protocols a sandbox
// may create. A refused one must be refused by the filter, before the
// kernel looks the family up (and may load a module for it): with an
// invalid type (15, past SOCK_MAX) the kernel itself would answer EINVAL,
// the filter answers EAFNOSUPPORT or EPROTONOSUPPORT.
func checkSockets([]string) error {
	for _, check := range []func() error{refusedFamilies, refusedNetlink, refusedIPProtocols, neededSockets} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// badType is an invalid socket type (past SOCK_MAX): the kernel itself
// answers EINVAL for it, so another error comes from the filter.
const badType = 15

// trySocket creates a socket and closes it at once.
func trySocket(domain, typ, proto int) error {
	fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, proto)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

// refusedFamilies checks that the families a sandbox has no use for are
// refused, by the filter, for every type and for socketpair.
func refusedFamilies() error {
	families := map[string]int{
		"AF_TIPC": unix.AF_TIPC, "AF_RDS": unix.AF_RDS, "AF_CAN": unix.AF_CAN,
		"AF_BLUETOOTH": unix.AF_BLUETOOTH, "AF_KCM": unix.AF_KCM, "AF_SMC": unix.AF_SMC,
		"AF_RXRPC": unix.AF_RXRPC, "AF_PACKET": unix.AF_PACKET, "AF_KEY": unix.AF_KEY,
		"AF_XDP": unix.AF_XDP, "AF_LLC": unix.AF_LLC, "AF_PPPOX": unix.AF_PPPOX,
		"AF_IEEE802154": unix.AF_IEEE802154, "AF_NFC": unix.AF_NFC, "AF_QIPCRTR": unix.AF_QIPCRTR,
		"AF_MCTP": unix.AF_MCTP, "AF_PHONET": unix.AF_PHONET, "AF_ATMPVC": unix.AF_ATMPVC,
		"AF_X25": unix.AF_X25, "AF_ALG": unix.AF_ALG, "AF_VSOCK": unix.AF_VSOCK, "AF_UNSPEC": unix.AF_UNSPEC,
	}
	for name, fam := range families {
		for _, typ := range []int{unix.SOCK_STREAM, unix.SOCK_DGRAM, unix.SOCK_SEQPACKET, unix.SOCK_RAW} {
			if err := trySocket(fam, typ, 0); err == nil {
				return escapef("socket(%s, %d) succeeded", name, typ)
			}
		}
		if err := trySocket(fam, badType, 0); err != unix.EAFNOSUPPORT {
			return escapef("socket(%s) reached the kernel: %v, want EAFNOSUPPORT from the filter", name, err)
		}
		if _, err := unix.Socketpair(fam, badType, 0); err != unix.EAFNOSUPPORT {
			return escapef("socketpair(%s) reached the kernel: %v, want EAFNOSUPPORT from the filter", name, err)
		}
	}
	return nil
}

// refusedNetlink checks that the netlink protocols but route and
// sock_diag are refused.
func refusedNetlink() error {
	netlink := map[string]int{
		"XFRM": unix.NETLINK_XFRM, "AUDIT": unix.NETLINK_AUDIT, "NETFILTER": unix.NETLINK_NETFILTER,
		"CONNECTOR": unix.NETLINK_CONNECTOR, "KOBJECT_UEVENT": unix.NETLINK_KOBJECT_UEVENT,
		"FIB_LOOKUP": unix.NETLINK_FIB_LOOKUP, "SELINUX": unix.NETLINK_SELINUX,
		"GENERIC": unix.NETLINK_GENERIC, "USERSOCK": unix.NETLINK_USERSOCK, "NFLOG": unix.NETLINK_NFLOG,
		"SCSITRANSPORT": unix.NETLINK_SCSITRANSPORT, "ISCSI": unix.NETLINK_ISCSI, "RDMA": unix.NETLINK_RDMA,
		"CRYPTO": unix.NETLINK_CRYPTO, "SMC": unix.NETLINK_SMC, "DNRTMSG": unix.NETLINK_DNRTMSG,
		"ECRYPTFS": unix.NETLINK_ECRYPTFS, "IP6_FW": unix.NETLINK_IP6_FW,
	}
	for name, proto := range netlink {
		for _, typ := range []int{unix.SOCK_RAW, unix.SOCK_DGRAM} {
			if err := trySocket(unix.AF_NETLINK, typ, proto); err != unix.EPROTONOSUPPORT {
				return escapef("socket(AF_NETLINK, %d, NETLINK_%s): %v, want EPROTONOSUPPORT", typ, name, err)
			}
		}
	}
	return nil
}

// refusedIPProtocols checks that IP with a protocol the kernel may have
// as a module (sctp, dccp, l2tp_ip, udplite) is refused by the filter.
func refusedIPProtocols() error {
	for name, p := range map[string][2]int{
		"AF_INET SCTP": {unix.AF_INET, unix.IPPROTO_SCTP}, "AF_INET6 SCTP": {unix.AF_INET6, unix.IPPROTO_SCTP},
		"AF_INET DCCP": {unix.AF_INET, unix.IPPROTO_DCCP}, "AF_INET L2TP": {unix.AF_INET, unix.IPPROTO_L2TP},
		"AF_INET6 L2TP": {unix.AF_INET6, unix.IPPROTO_L2TP}, "AF_INET UDPLITE": {unix.AF_INET, unix.IPPROTO_UDPLITE},
	} {
		if err := trySocket(p[0], badType, p[1]); err != unix.EPROTONOSUPPORT {
			return escapef("socket(%s) reached the kernel: %v, want EPROTONOSUPPORT from the filter", name, err)
		}
		for _, typ := range []int{unix.SOCK_STREAM, unix.SOCK_DGRAM, unix.SOCK_SEQPACKET} {
			if err := trySocket(p[0], typ, p[1]); err == nil {
				return escapef("socket(%s, %d) succeeded", name, typ)
			}
		}
	}
	return nil
}

// neededSockets checks that what a sandbox needs keeps working: unix and
// IP sockets, netlink route and sock_diag, and listing interfaces.
func neededSockets() error {
	for _, c := range []struct {
		name              string
		domain, typ, prot int
	}{
		{"AF_UNIX stream", unix.AF_UNIX, unix.SOCK_STREAM, 0},
		{"AF_UNIX dgram", unix.AF_UNIX, unix.SOCK_DGRAM, 0},
		{"AF_INET stream", unix.AF_INET, unix.SOCK_STREAM, 0},
		{"AF_INET TCP", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_TCP},
		{"AF_INET6 UDP", unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_UDP},
		{"AF_INET dgram", unix.AF_INET, unix.SOCK_DGRAM, 0},
		{"AF_INET6 stream", unix.AF_INET6, unix.SOCK_STREAM, 0},
		{"AF_INET6 dgram", unix.AF_INET6, unix.SOCK_DGRAM, 0},
		{"NETLINK_ROUTE", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE},
		{"NETLINK_ROUTE dgram", unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_ROUTE},
		{"NETLINK_SOCK_DIAG", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_SOCK_DIAG},
	} {
		if err := trySocket(c.domain, c.typ, c.prot); err != nil {
			return fmt.Errorf("socket(%s) refused: %v (the filter is too strict)", c.name, err)
		}
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socketpair(AF_UNIX) refused: %v", err)
	}
	unix.Close(fds[0])
	unix.Close(fds[1])
	// getifaddrs' netlink dump works.
	if _, err := net.Interfaces(); err != nil {
		return fmt.Errorf("listing interfaces over NETLINK_ROUTE: %v", err)
	}
	return nil
}

// checkCgroupNS checks that every cgroup hierarchy reads "/" from inside:
// anything else names the host's cgroup tree (fence/<instance>/<id>, or
// /../.. above the namespace's root).
func checkCgroupNS([]string) error {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) != 3 || f[2] != "/" {
			return escapef("/proc/self/cgroup shows a host path: %q", l)
		}
	}
	return nil
}
