package probe

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

var checks = []Check{
	// identity
	{Name: "uid", Group: "identity", run: checkUID,
		Proves: "the sandbox's uids and gids map to a host range without host uid/gid 0: sandbox root is not host root"},
	{Name: "no-new-privs", Group: "identity", run: statusIs("NoNewPrivs", "1"),
		Proves: "no_new_privs is set: no program run in the sandbox gains privileges through set-id bits or file capabilities"},
	{Name: "seccomp", Group: "identity", run: statusIs("Seccomp", "2"),
		Proves: "a seccomp filter (mode 2) is installed on every sandbox process"},
	{Name: "caps", Group: "identity", run: checkCaps,
		Proves: "the capability bounding set holds only Docker's default set minus MKNOD and NET_RAW (no SYS_ADMIN, NET_ADMIN, SYS_PTRACE, SYS_MODULE, …) and no capability is ambient"},

	// system calls
	{Name: "userns", Group: "syscalls", run: cloneRefused("CLONE_NEWUSER", syscall.CLONE_NEWUSER),
		Proves: "a new user namespace cannot be created (the door to nf_tables, overlayfs and cgroup release_agent exploits)"},
	{Name: "netns", Group: "syscalls", run: cloneRefused("CLONE_NEWNET", syscall.CLONE_NEWNET),
		Proves: "a new network namespace cannot be created"},
	{Name: "mount", Group: "syscalls", run: func([]string) error {
		return refused("mount(tmpfs, /tmp)", unix.Mount("tmpfs", "/tmp", "tmpfs", 0, ""))
	}, Proves: "mount(2) is refused"},
	{Name: "keyctl", Group: "syscalls", run: checkKeyctl,
		Proves: "the kernel keyring (keyctl) is unreachable"},
	{Name: "bpf", Group: "syscalls", run: kernelNotReached("bpf", unix.SYS_BPF, 0, 0, 0),
		Proves: "bpf(2) is refused before the kernel's BPF code sees it"},
	{Name: "perf", Group: "syscalls", run: kernelNotReached("perf_event_open", unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0)),
		Proves: "perf_event_open(2) is refused before the kernel's perf code sees it"},
	{Name: "io_uring", Group: "syscalls", run: kernelNotReached("io_uring_setup", unix.SYS_IO_URING_SETUP, 1, 0, 0),
		Proves: "io_uring_setup(2) is refused (io_uring operations would bypass seccomp)"},
	{Name: "userfaultfd", Group: "syscalls", run: func([]string) error {
		_, _, e := unix.Syscall(unix.SYS_USERFAULTFD, 0, 0, 0)
		return refusedErrno("userfaultfd", e)
	}, Proves: "userfaultfd(2), an exploit's race-widening tool, is refused"},
	{Name: "tiocsti", Group: "syscalls", run: checkTIOCSTI,
		Proves: "ioctl(TIOCSTI) cannot push input into a terminal, also with garbage in the request's high 32 bits"},
	{Name: "msg-oob", Group: "syscalls", run: checkMsgOOB,
		Proves: "MSG_OOB on unix sockets (a kernel use-after-free class) is refused while plain sends work"},
	{Name: "setid", Group: "syscalls", Args: "[DIR]", run: checkSetID,
		Proves: "no set-user-ID or set-group-ID file can be made (chmod, fchmodat, open with O_CREAT)"},
	{Name: "x32", Group: "syscalls", KilledBy: unix.SIGSYS, run: checkX32,
		Proves: "a system call through a foreign ABI (x32) kills the caller instead of dodging the filter"},

	// sockets
	{Name: "vsock", Group: "sockets", run: socketRefused("AF_VSOCK", unix.AF_VSOCK, unix.SOCK_STREAM),
		Proves: "AF_VSOCK sockets (a channel to the VM's host) cannot be created"},
	{Name: "alg", Group: "sockets", run: socketRefused("AF_ALG", unix.AF_ALG, unix.SOCK_SEQPACKET),
		Proves: "AF_ALG sockets (the kernel crypto API, used to write into the page cache of read-only files) cannot be created"},
	{Name: "packet", Group: "sockets", run: socketRefused("AF_PACKET", unix.AF_PACKET, unix.SOCK_RAW),
		Proves: "raw packet sockets cannot be created"},
	{Name: "sockets", Group: "sockets", run: checkSockets,
		Proves: "only AF_UNIX, AF_INET/AF_INET6 (TCP, UDP, ICMP, MPTCP) and AF_NETLINK (ROUTE, SOCK_DIAG) sockets can be made; every other family and protocol is refused by the filter before the kernel looks it up (or loads a module for it)"},
	{Name: "inet", Group: "sockets", run: checkInet,
		Proves: "plain TCP sockets can still be made (a control: the filter does not simply refuse everything)"},

	// filesystems
	{Name: "proc-masks", Group: "filesystems", run: checkProcMasks,
		Proves: "/proc/kcore, /proc/keys, /proc/timer_list and the other masked /proc and /sys paths show nothing"},
	{Name: "proc-sys-ro", Group: "filesystems", run: checkProcSysRO,
		Proves: "/proc/sys is mounted read-only: core_pattern, modprobe and even the sandbox's own hostname cannot be written"},
	{Name: "sysrq", Group: "filesystems", run: openWriteRefused("/proc/sysrq-trigger"),
		Proves: "/proc/sysrq-trigger cannot be opened for writing"},
	{Name: "sys-ro", Group: "filesystems", run: checkSysRO,
		Proves: "/sys is mounted read-only (uevent_helper cannot be written)"},
	{Name: "remount-proc", Group: "filesystems", run: func([]string) error {
		return refused("remount /proc/sys read-write", unix.Mount("", "/proc/sys", "", unix.MS_REMOUNT|unix.MS_BIND, ""))
	}, Proves: "the read-only /proc/sys cannot be remounted read-write"},
	{Name: "umount-mask", Group: "filesystems", run: func([]string) error {
		return refused("umount of the mask over /proc/kcore", unix.Unmount("/proc/kcore", unix.MNT_DETACH))
	}, Proves: "a mask cannot be unmounted to reveal what it covers"},

	// devices
	{Name: "devices", Group: "devices", run: checkDevices,
		Proves: "/dev holds no block device and no character device beyond null, zero, full, random, urandom, tty and the sandbox's own pseudo-terminals"},
	{Name: "mknod", Group: "devices", run: checkMknod,
		Proves: "device nodes cannot be created"},

	// processes
	{Name: "fds", Group: "processes", run: checkFDs,
		Proves: "a process the agent starts inherits no descriptor beyond stdin, stdout and stderr (leaked descriptors were runc's CVE-2024-21626)"},
	{Name: "agent-proc", Group: "processes", run: checkAgentProc,
		Proves: "the agent's memory, environment and descriptors cannot be read through /proc/1"},
	{Name: "ptrace-init", Group: "processes", run: checkPtraceInit,
		Proves: "PID 1 (the agent) cannot be traced"},
	{Name: "agent-reach", Group: "processes", Args: "[PORT]", run: checkAgentReach,
		Proves: "no process in the sandbox can drive the agent: on loopback and on the sandbox's own addresses, its port (envd's 49983) takes no request to start a command (which would run it as root, past the template's sudo rules)"},
	{Name: "cgroupns", Group: "processes", run: checkCgroupNS,
		Proves: "every cgroup hierarchy reads / from inside: the sandbox's cgroup namespace hides the host's cgroup tree"},
	{Name: "exe-write", Group: "processes", run: checkExeWrite,
		Proves: "fence's own binary, which runs the agent and every probe, is on a read-only mount and cannot be opened for writing, directly or through /proc/self/exe and /proc/1/exe (runc's CVE-2019-5736)"},

	// network
	{Name: "egress", Group: "network", Args: "ADDR:PORT...", run: connectRefused,
		Proves: "TCP connections to outside addresses are refused by default (no policy, no egress)"},
	{Name: "egress-host", Group: "network", Args: "ADDR:PORT...", run: connectRefused,
		Proves: "the host's own addresses cannot be reached from the sandbox"},
	{Name: "dns", Group: "network", Args: "NAME", run: checkDNS,
		Proves: "the sandbox's resolver answers no name that its policy does not allow (no DNS exfiltration by default)"},

	// limits (last: they load the sandbox)
	{Name: "pids-limit", Group: "limits", Args: "MAX", run: checkPidsLimit,
		Proves: "a fork bomb is held by the sandbox's pids limit"},
	{Name: "memory-limit", Group: "limits", Args: "BYTES", KilledBy: unix.SIGKILL, run: checkMemoryLimit,
		Proves: "a memory balloon is killed inside the sandbox at its memory limit"},
}

func refused(what string, err error) error {
	if err == nil {
		return escapef("%s succeeded", what)
	}
	return nil
}

func refusedErrno(what string, e syscall.Errno) error {
	if e == 0 {
		return escapef("%s succeeded", what)
	}
	return nil
}

// status returns the value of field in /proc/self/status.
func status(field string) (string, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no %s in /proc/self/status", field)
}

func statusIs(field, want string) func([]string) error {
	return func([]string) error {
		v, err := status(field)
		if err != nil {
			return err
		}
		if v != want {
			return escapef("%s is %s, want %s", field, v, want)
		}
		return nil
	}
}

func checkUID([]string) error {
	for _, f := range []string{"/proc/self/uid_map", "/proc/self/gid_map"} {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		for _, l := range lines {
			var inside, outside, count uint64
			if n, _ := fmt.Sscan(l, &inside, &outside, &count); n != 3 {
				return fmt.Errorf("%s: unreadable line %q", f, l)
			}
			if outside == 0 {
				return escapef("%s maps sandbox id %d to host id 0: %q", f, inside, l)
			}
		}
		if len(lines) == 0 {
			return fmt.Errorf("%s is empty", f)
		}
	}
	return nil
}

// allowedCaps are the capabilities the native backend leaves in the
// bounding set (Docker's default set minus MKNOD and NET_RAW).
var allowedCaps = []int{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID, unix.CAP_KILL,
	unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SETPCAP, unix.CAP_NET_BIND_SERVICE,
	unix.CAP_SYS_CHROOT, unix.CAP_AUDIT_WRITE, unix.CAP_SETFCAP,
}

func checkCaps([]string) error {
	var allowed uint64
	for _, c := range allowedCaps {
		allowed |= 1 << c
	}
	for _, field := range []string{"CapBnd", "CapAmb"} {
		v, err := status(field)
		if err != nil {
			return err
		}
		var set uint64
		if _, err := fmt.Sscanf(v, "%x", &set); err != nil {
			return fmt.Errorf("%s: %q: %w", field, v, err)
		}
		if field == "CapAmb" {
			allowed = 0
		}
		if extra := set &^ allowed; extra != 0 {
			var names []string
			for c := 0; c < 64; c++ {
				if extra&(1<<c) != 0 {
					names = append(names, capName(c))
				}
			}
			return escapef("%s holds %s", field, strings.Join(names, ", "))
		}
	}
	return nil
}

func capName(c int) string {
	names := map[int]string{
		unix.CAP_SYS_ADMIN: "CAP_SYS_ADMIN", unix.CAP_NET_ADMIN: "CAP_NET_ADMIN", unix.CAP_SYS_PTRACE: "CAP_SYS_PTRACE",
		unix.CAP_MKNOD: "CAP_MKNOD", unix.CAP_NET_RAW: "CAP_NET_RAW", unix.CAP_SYS_MODULE: "CAP_SYS_MODULE",
		unix.CAP_DAC_READ_SEARCH: "CAP_DAC_READ_SEARCH", unix.CAP_SYS_RAWIO: "CAP_SYS_RAWIO", unix.CAP_BPF: "CAP_BPF",
		unix.CAP_PERFMON: "CAP_PERFMON", unix.CAP_SYS_BOOT: "CAP_SYS_BOOT", unix.CAP_SYS_TIME: "CAP_SYS_TIME",
	}
	if n, ok := names[c]; ok {
		return n
	}
	return fmt.Sprintf("capability %d", c)
}

// cloneRefused starts a child in a new namespace. The probe's own binary
// is the child, so the check does not depend on what the template holds;
// the same start without the flag must work (otherwise the refusal proves
// nothing).
func cloneRefused(name string, flag uintptr) func([]string) error {
	return func([]string) error {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		start := func(flags uintptr) error {
			cmd := exec.Command(self)
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
			err := cmd.Run()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return nil // it started: how it ended does not matter
			}
			return err
		}
		if err := start(0); err != nil {
			return fmt.Errorf("starting a plain child failed: %w", err)
		}
		return refused("clone("+name+")", start(flag))
	}
}

func checkKeyctl([]string) error {
	_, _, e := unix.Syscall(unix.SYS_KEYCTL, 0 /* KEYCTL_GET_KEYRING_ID */, ^uintptr(3) /* session */, 0)
	return refusedErrno("keyctl", e)
}

// kernelNotReached calls a system call with arguments the kernel itself
// would reject with EFAULT or EINVAL: seeing those means the filter let it
// through.
func kernelNotReached(name string, nr, a1, a2, a3 uintptr) func([]string) error {
	return func([]string) error {
		_, _, e := unix.Syscall6(nr, a1, a2, a3, ^uintptr(0), 0, 0)
		if e == unix.EFAULT || e == unix.EINVAL {
			return escapef("%s reached the kernel (errno %v)", name, e)
		}
		return refusedErrno(name, e)
	}
}

func checkTIOCSTI([]string) error {
	c := byte('x')
	for _, req := range []uintptr{unix.TIOCSTI, unix.TIOCSTI | 0xffffffff00000000} {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, 0, req, uintptr(unsafe.Pointer(&c)))
		if e == unix.ENOTTY || e == unix.EBADF || e == 0 {
			return escapef("ioctl(TIOCSTI %#x) reached the kernel (errno %v)", req, e)
		}
	}
	return nil
}

func checkMsgOOB([]string) error {
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
}

// checkSetID tries to make set-id files in DIR (/tmp by default): in a
// directory bound from the host they would be set-id programs there.
func checkSetID(args []string) error {
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
			return escapef("chmod %o succeeded", m)
		}
		if unix.Fchmodat(unix.AT_FDCWD, f, m, 0) == nil {
			return escapef("fchmodat %o succeeded", m)
		}
	}
	fd, err := unix.Open(dir+"/setid-probe2", unix.O_CREAT|unix.O_WRONLY, 0o4755)
	if err == nil {
		unix.Close(fd)
		os.Remove(dir + "/setid-probe2")
		return escapef("open(O_CREAT, 04755) succeeded")
	}
	if err := unix.Chmod(f, 0o700); err != nil {
		return fmt.Errorf("plain chmod refused: %v", err)
	}
	if err := unix.Mkdir(dir+"/setgid-dir", 0o2775); err != nil {
		return fmt.Errorf("mkdir with setgid refused: %v", err)
	}
	os.Remove(dir + "/setgid-dir")
	return nil
}

// checkX32 makes an x32 system call (getpid | __X32_SYSCALL_BIT), which must
// kill the probe; reaching the next line is an escape of the arch check.
func checkX32([]string) error {
	runtime.LockOSThread()
	unix.RawSyscall(unix.SYS_GETPID|0x40000000, 0, 0, 0)
	return escapef("x32 syscall returned")
}

func socketRefused(name string, family, typ int) func([]string) error {
	return func([]string) error {
		fd, err := unix.Socket(family, typ, 0)
		if err == nil {
			unix.Close(fd)
		}
		return refused("socket("+name+")", err)
	}
}

func checkInet([]string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		return fmt.Errorf("plain TCP socket refused: %v (the filter is too strict)", err)
	}
	unix.Close(fd)
	return nil
}
