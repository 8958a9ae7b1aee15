package seccomp

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The helper process: the test binary re-executed with helperEnv set runs
// the named mode instead of the tests (the os/exec exec_test.go pattern).
const helperEnv = "FENCE_SECCOMP_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "checks":
		os.Exit(helperChecks())
	case "x32":
		helperX32()
	}
	fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", os.Getenv(helperEnv))
	os.Exit(2)
}

// enter locks the thread, sets no_new_privs and installs fence's filter.
func enter() error {
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	prog, err := Program()
	if err != nil {
		return err
	}
	return InstallAllThreads(prog)
}

func helperX32() {
	if err := enter(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	unix.RawSyscall(x32Bit|unix.SYS_GETPID, 0, 0, 0)
	fmt.Fprintln(os.Stderr, "x32 getpid returned")
	os.Exit(3)
}

func rawErr(trap uintptr, a ...uintptr) error {
	var args [6]uintptr
	copy(args[:], a)
	_, _, e := unix.Syscall6(trap, args[0], args[1], args[2], args[3], args[4], args[5])
	if e != 0 {
		return e
	}
	return nil
}

func helperChecks() int {
	pid := unix.Getpid()
	if err := enter(); err != nil {
		fmt.Fprintln(os.Stderr, "enter:", err)
		return 2
	}
	failed := 0
	expect := func(what string, got, want error) {
		ok := errors.Is(got, want) || (want == errAny && got != nil)
		if !ok {
			fmt.Fprintf(os.Stderr, "FAIL %s: error = %v, want %v\n", what, got, want)
			failed++
		}
	}
	socketProto := func(domain uint64, typ int, proto uintptr) error {
		fd, _, e := unix.Syscall(unix.SYS_SOCKET, uintptr(domain), uintptr(typ|unix.SOCK_CLOEXEC), proto)
		if e != 0 {
			return e
		}
		unix.Close(int(fd))
		return nil
	}
	socket := func(domain uint64, typ int) error { return socketProto(domain, typ, 0) }
	expect("socket(AF_VSOCK)", socket(unix.AF_VSOCK, unix.SOCK_STREAM), unix.EAFNOSUPPORT)
	expect("socket(AF_ALG)", socket(unix.AF_ALG, unix.SOCK_SEQPACKET), unix.EAFNOSUPPORT)
	expect("socket(AF_TIPC)", socket(unix.AF_TIPC, unix.SOCK_RDM), unix.EAFNOSUPPORT)
	expect("socket(AF_PACKET)", socket(unix.AF_PACKET, unix.SOCK_RAW), unix.EAFNOSUPPORT)
	expect("socket(AF_INET)", socket(unix.AF_INET, unix.SOCK_STREAM), nil)
	expect("socket(AF_INET6)", socket(unix.AF_INET6, unix.SOCK_DGRAM), nil)
	expect("socket(AF_UNIX)", socket(unix.AF_UNIX, unix.SOCK_STREAM), nil)
	expect("socket(AF_INET|1<<32)", socket(1<<32|unix.AF_INET, unix.SOCK_STREAM), unix.EAFNOSUPPORT)
	expect("socket(AF_NETLINK, ROUTE)", socketProto(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE), nil)
	expect("socket(AF_NETLINK, SOCK_DIAG)", socketProto(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_SOCK_DIAG), nil)
	expect("socket(AF_NETLINK, XFRM)", socketProto(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_XFRM), unix.EPROTONOSUPPORT)
	expect("socket(AF_NETLINK, KOBJECT_UEVENT)", socketProto(unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT), unix.EPROTONOSUPPORT)
	_, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	expect("socketpair(AF_UNIX)", err, nil)
	_, err = unix.Socketpair(unix.AF_TIPC, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	expect("socketpair(AF_TIPC)", err, unix.EAFNOSUPPORT)

	var params [120]byte
	expect("io_uring_setup", rawErr(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params))), unix.ENOSYS)
	expect("clone3", rawErr(unix.SYS_CLONE3, 0, 0), unix.ENOSYS)
	expect("mount", unix.Mount("none", os.TempDir(), "tmpfs", 0, ""), unix.EPERM)
	expect("umount2", unix.Unmount("/proc", unix.MNT_DETACH), unix.EPERM)
	expect("fsopen", rawErr(unix.SYS_FSOPEN, uintptr(unsafe.Pointer(&[]byte("tmpfs\x00")[0])), 0), unix.EPERM)
	_, err = unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	expect("keyctl", err, unix.EPERM)
	expect("add_key", rawErr(unix.SYS_ADD_KEY, 0, 0, 0, 0, 0), unix.EPERM)
	expect("bpf", rawErr(unix.SYS_BPF, unix.BPF_PROG_LOAD, 0, 0), unix.EPERM)
	expect("perf_event_open", rawErr(unix.SYS_PERF_EVENT_OPEN, 0, 0, 0, 0, 0), unix.EPERM)
	expect("userfaultfd", rawErr(unix.SYS_USERFAULTFD, 0), unix.EPERM)
	expect("unshare(CLONE_NEWUSER)", unix.Unshare(unix.CLONE_NEWUSER), unix.EPERM)
	expect("setns", unix.Setns(0, 0), unix.EPERM)
	expect("ptrace(PEEKDATA, 1)", rawErr(unix.SYS_PTRACE, unix.PTRACE_PEEKDATA, 1, 0, 0), unix.EPERM)
	expect("personality(ADDR_NO_RANDOMIZE)", rawErr(unix.SYS_PERSONALITY, 0x20000), unix.EPERM)
	expect("personality(query)", rawErr(unix.SYS_PERSONALITY, 0xffffffff), nil)

	null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	expect("open /dev/null", err, nil)
	c := byte('x')
	// Unfiltered, TIOCSTI on /dev/null is ENOTTY; EPERM is the filter.
	expect("ioctl(TIOCSTI)", rawErr(unix.SYS_IOCTL, uintptr(null), unix.TIOCSTI, uintptr(unsafe.Pointer(&c))), unix.EPERM)
	expect("ioctl(TIOCSTI|1<<32)", rawErr(unix.SYS_IOCTL, uintptr(null), 1<<32|unix.TIOCSTI, uintptr(unsafe.Pointer(&c))), unix.EPERM)
	expect("ioctl(TIOCLINUX|0xffffffff<<32)", rawErr(unix.SYS_IOCTL, uintptr(null), 0xffffffff<<32|unix.TIOCLINUX, uintptr(unsafe.Pointer(&c))), unix.EPERM)
	_, err = unix.IoctlGetWinsize(null, unix.TIOCGWINSZ)
	expect("ioctl(TIOCGWINSZ)", err, unix.ENOTTY)
	unix.Close(null)

	// Normal work.
	if got := unix.Getpid(); got != pid {
		fmt.Fprintf(os.Stderr, "FAIL getpid = %d, want %d\n", got, pid)
		failed++
	}
	dir := os.Getenv("FENCE_SECCOMP_DIR")
	f := filepath.Join(dir, "file")
	expect("write file", os.WriteFile(f, []byte("hello"), 0o600), nil)
	b, err := os.ReadFile(f)
	expect("read file", err, nil)
	if string(b) != "hello" {
		fmt.Fprintf(os.Stderr, "FAIL read back %q, want hello\n", b)
		failed++
	}
	expect("exec /bin/true", exec.Command("/bin/true").Run(), nil)
	out, err := exec.Command("/bin/sh", "-c", "echo $((6*7))").Output()
	expect("exec sh", err, nil)
	if strings.TrimSpace(string(out)) != "42" {
		fmt.Fprintf(os.Stderr, "FAIL sh output %q, want 42\n", out)
		failed++
	}

	// Namespaces from fresh children, which inherit the filter.
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
	expect("clone(CLONE_NEWUSER) child", cmd.Run(), unix.EPERM)
	if p, err := exec.LookPath("unshare"); err == nil {
		out, err := exec.Command(p, "-U", "true").CombinedOutput()
		expect("unshare -U true", err, errAny)
		fmt.Fprintf(os.Stdout, "unshare -U true under the filter: %v: %s\n", err, strings.TrimSpace(string(out)))
		_, err = exec.Command(p, "-m", "true").CombinedOutput()
		expect("unshare -m true", err, errAny)
	} else {
		fmt.Fprintln(os.Stdout, "unshare binary not found; skipped the util-linux check")
	}
	if failed > 0 {
		return 1
	}
	fmt.Fprintln(os.Stdout, "all checks passed")
	return 0
}

// errAny as a wanted error means "any non-nil error".
var errAny = errors.New("any error")

func helper(t *testing.T, mode string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "FENCE_SECCOMP_DIR="+t.TempDir())
	return cmd
}

func TestInstalledFilter(t *testing.T) {
	// Control: user namespaces work here without the filter, so a failure
	// under it is the filter's doing.
	if p, err := exec.LookPath("unshare"); err == nil {
		if out, err := exec.Command(p, "-U", "true").CombinedOutput(); err != nil {
			t.Logf("control: unshare -U true fails even without the filter: %v: %s", err, out)
		}
	}
	out, err := helper(t, "checks").CombinedOutput()
	t.Logf("helper output:\n%s", out)
	if err != nil {
		t.Fatalf("helper checks: %v", err)
	}
}

func TestX32Killed(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("x32 exists only on amd64")
	}
	err := helper(t, "x32").Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("x32 helper error = %v, want killed by SIGSYS", err)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGSYS {
		t.Fatalf("x32 helper status = %v, want killed by SIGSYS", ee)
	}
}

func TestInstallErrors(t *testing.T) {
	if err := InstallAllThreads(nil); err == nil {
		t.Errorf("InstallAllThreads(nil) error = nil, want error")
	}
	if err := InstallAllThreads(make([]unix.SockFilter, maxInsns+1)); err == nil {
		t.Errorf("InstallAllThreads(%d insns) error = nil, want error", maxInsns+1)
	}
}
