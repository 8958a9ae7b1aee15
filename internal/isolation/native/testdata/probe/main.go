// Command probe attacks the sandbox it runs in. The native backend's tests
// bind-mount it into a sandbox and run one check per invocation; each check
// prints "ok" when the attack was refused and "ESCAPE: ..." when it worked.
package main

import (
	"fmt"
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

func refusedErrno(what string, e syscall.Errno) error {
	if e == 0 {
		return fmt.Errorf("%s succeeded", what)
	}
	return nil
}
