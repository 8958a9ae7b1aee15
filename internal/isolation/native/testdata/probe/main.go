// Command probe attacks the sandbox it runs in. The native backend's tests
// bind-mount it into a sandbox and run one check per invocation; each check
// prints "ok" when the attack was refused and "ESCAPE: ..." when it worked.
package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Println("usage: probe CHECK")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2:]); err != nil {
		fmt.Println("ESCAPE:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

func refused(what string, err error) error {
	if err == nil {
		return fmt.Errorf("%s succeeded", what)
	}
	return nil
}

func run(check string, args []string) error {
	switch check {
	case "vsock":
		fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
		if err == nil {
			unix.Close(fd)
		}
		return refused("socket(AF_VSOCK)", err)
	case "alg":
		fd, err := unix.Socket(unix.AF_ALG, unix.SOCK_SEQPACKET, 0)
		if err == nil {
			unix.Close(fd)
		}
		return refused("socket(AF_ALG)", err)
	case "inet":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return fmt.Errorf("plain TCP socket refused: %v (the filter is too strict)", err)
		}
		unix.Close(fd)
		return nil
	case "userns":
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
		return refused("clone(CLONE_NEWUSER)", cmd.Run())
	case "netns":
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
		return refused("clone(CLONE_NEWNET)", cmd.Run())
	case "mount":
		return refused("mount(tmpfs)", unix.Mount("tmpfs", "/tmp", "tmpfs", 0, ""))
	case "remount-proc":
		return refused("remount /proc/sys rw", unix.Mount("", "/proc/sys", "", unix.MS_REMOUNT|unix.MS_BIND, ""))
	case "umount-mask":
		return refused("umount masked /proc/kcore", unix.Unmount("/proc/kcore", unix.MNT_DETACH))
	case "keyctl":
		_, _, e := unix.Syscall(unix.SYS_KEYCTL, 0 /* KEYCTL_GET_KEYRING_ID */, ^uintptr(3) /* session */, 0)
		return refusedErrno("keyctl", e)
	case "bpf":
		_, _, e := unix.Syscall(unix.SYS_BPF, 0, 0, 0)
		if e == unix.EFAULT || e == unix.EINVAL {
			return fmt.Errorf("bpf reached the kernel (errno %v)", e)
		}
		return refusedErrno("bpf", e)
	case "perf":
		_, _, e := unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0, 0)
		if e == unix.EFAULT || e == unix.EINVAL {
			return fmt.Errorf("perf_event_open reached the kernel (errno %v)", e)
		}
		return refusedErrno("perf_event_open", e)
	case "io_uring":
		_, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, 0, 0)
		if e == unix.EFAULT || e == unix.EINVAL {
			return fmt.Errorf("io_uring_setup reached the kernel (errno %v)", e)
		}
		return refusedErrno("io_uring_setup", e)
	case "userfaultfd":
		_, _, e := unix.Syscall(unix.SYS_USERFAULTFD, 0, 0, 0)
		return refusedErrno("userfaultfd", e)
	case "tiocsti":
		c := byte('x')
		for _, req := range []uintptr{unix.TIOCSTI, unix.TIOCSTI | 0xffffffff00000000} {
			_, _, e := unix.Syscall(unix.SYS_IOCTL, 0, req, uintptr(unsafe.Pointer(&c)))
			if e == unix.ENOTTY || e == unix.EBADF || e == 0 {
				return fmt.Errorf("ioctl(TIOCSTI %#x) reached the kernel (errno %v)", req, e)
			}
		}
		return nil
	case "core_pattern":
		f, err := os.OpenFile("/proc/sys/kernel/core_pattern", os.O_WRONLY, 0)
		if err == nil {
			f.Close()
		}
		return refused("open core_pattern for write", err)
	case "sysrq":
		f, err := os.OpenFile("/proc/sysrq-trigger", os.O_WRONLY, 0)
		if err == nil {
			f.Close()
		}
		return refused("open /proc/sysrq-trigger for write", err)
	case "sys-write":
		f, err := os.OpenFile("/sys/kernel/uevent_helper", os.O_WRONLY, 0)
		if err == nil {
			f.Close()
		}
		return refused("open /sys/kernel/uevent_helper for write", err)
	case "kcore":
		b, err := os.ReadFile("/proc/kcore")
		if err == nil && len(b) > 0 {
			return fmt.Errorf("/proc/kcore readable (%d bytes)", len(b))
		}
		return nil
	case "mknod":
		return refused("mknod /tmp/sda", unix.Mknod("/tmp/sda", unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
	case "uid":
		b, err := os.ReadFile("/proc/self/uid_map")
		if err != nil {
			return err
		}
		f := strings.Fields(string(b))
		if len(f) < 3 || f[1] == "0" {
			return fmt.Errorf("sandbox root maps to host uid 0: %q", b)
		}
		return nil
	case "seccomp":
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), "Seccomp:\t2") {
			return fmt.Errorf("seccomp filter not active")
		}
		if !strings.Contains(string(b), "NoNewPrivs:\t1") {
			return fmt.Errorf("no_new_privs not set")
		}
		return nil
	case "caps":
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return err
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "CapBnd:") {
				var v uint64
				fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(l, "CapBnd:")), "%x", &v)
				if v&(1<<unix.CAP_SYS_ADMIN) != 0 || v&(1<<unix.CAP_NET_ADMIN) != 0 || v&(1<<unix.CAP_SYS_PTRACE) != 0 || v&(1<<unix.CAP_MKNOD) != 0 {
					return fmt.Errorf("bounding set too wide: %s", l)
				}
				return nil
			}
		}
		return fmt.Errorf("no CapBnd")
	case "x32":
		// An x32 syscall number (getpid | __X32_SYSCALL_BIT) must kill us;
		// reaching the next line is an escape of the arch check.
		runtime.LockOSThread()
		unix.RawSyscall(unix.SYS_GETPID|0x40000000, 0, 0, 0)
		return fmt.Errorf("x32 syscall returned")
	case "balloon":
		var hold [][]byte
		for i := 0; i < 4096; i++ {
			b := make([]byte, 1<<20)
			for j := range b {
				b[j] = byte(j)
			}
			hold = append(hold, b)
		}
		return fmt.Errorf("allocated 4 GiB (%d chunks)", len(hold))
	case "setid":
		// No set-user-ID or set-group-ID file may be made: it would be a
		// set-id program on the host in a directory bound from there.
		dir := "/tmp"
		if len(args) > 0 {
			dir = args[0]
		}
		f := dir + "/setid-probe"
		os.Remove(f)
		if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); err != nil {
			return fmt.Errorf("plain file refused: %v", err)
		}
		defer os.Remove(f)
		for _, m := range []uint32{0o4755, 0o2755, 0o6755} {
			if unix.Chmod(f, m) == nil {
				return fmt.Errorf("chmod %o succeeded", m)
			}
			if unix.Fchmodat(unix.AT_FDCWD, f, m, 0) == nil {
				return fmt.Errorf("fchmodat %o succeeded", m)
			}
		}
		fd, err := unix.Open(dir+"/setid-probe2", unix.O_CREAT|unix.O_WRONLY, 0o4755)
		if err == nil {
			unix.Close(fd)
			os.Remove(dir + "/setid-probe2")
			return fmt.Errorf("open(O_CREAT, 04755) succeeded")
		}
		if err := unix.Chmod(f, 0o700); err != nil {
			return fmt.Errorf("plain chmod refused: %v", err)
		}
		if err := unix.Mkdir(dir+"/setgid-dir", 0o2775); err != nil {
			return fmt.Errorf("mkdir with setgid refused: %v", err)
		}
		os.Remove(dir + "/setgid-dir")
		return nil
	case "msg-oob":
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fds[0])
		defer unix.Close(fds[1])
		if err := unix.Send(fds[0], []byte("x"), 0); err != nil {
			return fmt.Errorf("plain send refused: %v (the filter is too strict)", err)
		}
		return refused("send(MSG_OOB) on a unix socket", unix.Sendto(fds[0], []byte("x"), unix.MSG_OOB, nil))
	case "fds":
		// Only stdio may be open in a process the agent starts: a
		// descriptor of the daemon's or the agent's is a way out (runc
		// CVE-2024-21626).
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			return err
		}
		var extra []string
		for _, e := range ents {
			if n := e.Name(); n != "0" && n != "1" && n != "2" {
				target, err := os.Readlink("/proc/self/fd/" + n)
				if err == nil { // err: the descriptor ReadDir itself used
					extra = append(extra, n+"->"+target)
				}
			}
		}
		if len(extra) > 0 {
			return fmt.Errorf("inherited descriptors: %v", extra)
		}
		return nil
	case "agent-proc":
		for _, f := range []string{"/proc/1/mem", "/proc/1/environ"} {
			if fd, err := os.Open(f); err == nil {
				fd.Close()
				return fmt.Errorf("%s of the agent opened", f)
			}
		}
		// Listing /proc/1/fd shows numbers only; following an entry
		// needs ptrace access, which a non-dumpable agent denies.
		ents, _ := os.ReadDir("/proc/1/fd")
		for _, e := range ents {
			p := "/proc/1/fd/" + e.Name()
			if t, err := os.Readlink(p); err == nil {
				return fmt.Errorf("%s of the agent readable: %s", p, t)
			}
			if f, err := os.Open(p); err == nil {
				f.Close()
				return fmt.Errorf("%s of the agent opened", p)
			}
		}
		return nil
	case "sockets":
		return sockets()
	case "cgroupns":
		// Every hierarchy must read "/": anything else names the host's
		// cgroup tree (fence/<instance>/<id>, or /../.. above the root).
		b, err := os.ReadFile("/proc/self/cgroup")
		if err != nil {
			return err
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if f := strings.SplitN(l, ":", 3); len(f) != 3 || f[2] != "/" {
				return fmt.Errorf("/proc/self/cgroup shows a host path: %q", l)
			}
		}
		return nil
	case "ptrace-init":
		err := unix.PtraceAttach(1)
		if err == nil {
			unix.PtraceDetach(1)
			unix.Kill(1, unix.SIGCONT)
		}
		return refused("ptrace(ATTACH, 1)", err)
	}
	return fmt.Errorf("unknown check %q", check)
}

// sockets checks the socket families and netlink protocols a sandbox may
// create. A refused one must be refused by the filter, before the kernel
// looks the family up (and may load a module for it): with an invalid type
// (15, past SOCK_MAX) the kernel itself would answer EINVAL, the filter
// answers EAFNOSUPPORT or EPROTONOSUPPORT.
func sockets() error {
	try := func(domain, typ, proto int) error {
		fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, proto)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}
	const badType = 15
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
			if err := try(fam, typ, 0); err == nil {
				return fmt.Errorf("socket(%s, %d) succeeded", name, typ)
			}
		}
		if err := try(fam, badType, 0); err != unix.EAFNOSUPPORT {
			return fmt.Errorf("socket(%s) reached the kernel: %v, want EAFNOSUPPORT from the filter", name, err)
		}
		if _, err := unix.Socketpair(fam, badType, 0); err != unix.EAFNOSUPPORT {
			return fmt.Errorf("socketpair(%s) reached the kernel: %v, want EAFNOSUPPORT from the filter", name, err)
		}
	}
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
			if err := try(unix.AF_NETLINK, typ, proto); err != unix.EPROTONOSUPPORT {
				return fmt.Errorf("socket(AF_NETLINK, %d, NETLINK_%s): %v, want EPROTONOSUPPORT", typ, name, err)
			}
		}
	}
	// IP with a protocol the kernel may have as a module (sctp, dccp,
	// l2tp_ip): refused by the filter (with the invalid type the kernel
	// itself would answer EINVAL).
	for name, p := range map[string][2]int{
		"AF_INET SCTP": {unix.AF_INET, unix.IPPROTO_SCTP}, "AF_INET6 SCTP": {unix.AF_INET6, unix.IPPROTO_SCTP},
		"AF_INET DCCP": {unix.AF_INET, unix.IPPROTO_DCCP}, "AF_INET L2TP": {unix.AF_INET, unix.IPPROTO_L2TP},
		"AF_INET6 L2TP": {unix.AF_INET6, unix.IPPROTO_L2TP}, "AF_INET UDPLITE": {unix.AF_INET, unix.IPPROTO_UDPLITE},
	} {
		if err := try(p[0], badType, p[1]); err != unix.EPROTONOSUPPORT {
			return fmt.Errorf("socket(%s) reached the kernel: %v, want EPROTONOSUPPORT from the filter", name, err)
		}
		for _, typ := range []int{unix.SOCK_STREAM, unix.SOCK_DGRAM, unix.SOCK_SEQPACKET} {
			if err := try(p[0], typ, p[1]); err == nil {
				return fmt.Errorf("socket(%s, %d) succeeded", name, typ)
			}
		}
	}
	// What a sandbox needs keeps working.
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
		if err := try(c.domain, c.typ, c.prot); err != nil {
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

func refusedErrno(what string, e syscall.Errno) error {
	if e == 0 {
		return fmt.Errorf("%s succeeded", what)
	}
	return nil
}
