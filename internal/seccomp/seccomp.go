// Package seccomp compiles fence's sandbox syscall policy to a classic BPF
// seccomp filter, in pure Go, and installs it.
//
// The policy is Docker's default profile (github.com/moby/profiles/seccomp)
// resolved for the native architecture and the running kernel with an empty
// capability set, so every capability-gated group drops out, then tightened:
//
//   - ptrace and process_vm_readv/writev are denied, as are the personality
//     values Docker allows beyond PER_LINUX and the query (ASLR stays on);
//   - io_uring_* and clone3 fail with ENOSYS, so libuv falls back to epoll
//     and glibc to clone(2), whose flags the filter inspects;
//   - clone with any CLONE_NEW* flag, unshare, setns, the mount family,
//     userfaultfd, bpf, perf_event_open, keyctl/add_key/request_key fail
//     with EPERM;
//   - ioctl TIOCSTI and TIOCLINUX fail with EPERM, compared on the low 32
//     bits of the request only (CVE-2019-10063);
//   - socket and socketpair accept only AF_UNIX, AF_INET and AF_INET6 (with
//     protocol 0, TCP, UDP, ICMP or MPTCP) and AF_NETLINK with NETLINK_ROUTE
//     or NETLINK_SOCK_DIAG: any other family fails with EAFNOSUPPORT and any
//     other protocol with EPROTONOSUPPORT, before the kernel could load a
//     module for it (Docker's wider family list is replaced).
//
// # Guarantees
//
//   - The filter is an allowlist: anything not allowed returns EPERM.
//   - A syscall from any other audit architecture (i386 via int 0x80, arm
//     compat) or with the x32 bit set kills the process: the rules are
//     keyed by native syscall numbers, so foreign ABIs never reach them.
//   - Argument comparisons cover both 32-bit halves of the 64-bit argument,
//     except where the kernel itself ignores the high half.
//   - Programs stay under the kernel's 4096-instruction limit; conditional
//     jumps beyond 255 instructions go through BPF_JA trampolines.
//
// Supported architectures: amd64 and arm64.
package seccomp

//go:generate go run gen_sysnum.go

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Program returns fence's sandbox filter compiled for the running
// architecture and kernel.
func Program() ([]unix.SockFilter, error) {
	arch, ok := arches[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("seccomp: unsupported architecture %s", runtime.GOARCH)
	}
	kernel, err := kernelVersion()
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	p, err := fencePolicy(arch.name, kernel)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	prog, err := compile(p, arch)
	if err != nil {
		return nil, fmt.Errorf("seccomp: compiling filter: %w", err)
	}
	return prog, nil
}

// InstallAllThreads installs prog with SECCOMP_SET_MODE_FILTER on every
// thread of the calling process at once (SECCOMP_FILTER_FLAG_TSYNC): a
// process that becomes a sandbox's without an exec is a Go program, which
// starts its commands from any of its threads. Everything the process and
// its children do afterwards is filtered.
//
// It does not set no_new_privs: the calling thread must have set
// PR_SET_NO_NEW_PRIVS or hold CAP_SYS_ADMIN, or the kernel refuses
// (EACCES); the other threads get no_new_privs from the calling thread
// with the filter. It fails, installing nothing, if any thread cannot
// take the filter.
func InstallAllThreads(prog []unix.SockFilter) error {
	if len(prog) == 0 {
		return errors.New("seccomp: empty filter")
	}
	if len(prog) > maxInsns {
		return fmt.Errorf("seccomp: filter has %d instructions, the kernel allows %d", len(prog), maxInsns)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("seccomp: installing filter: %w", errno)
	}
	if r != 0 { // the thread that could not take it
		return fmt.Errorf("seccomp: thread %d cannot take the filter", r)
	}
	return nil
}

// kernelVersion returns the running kernel's version and major revision.
func kernelVersion() ([2]uint64, error) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return [2]uint64{}, fmt.Errorf("reading kernel version: %w", err)
	}
	return parseRelease(unix.ByteSliceToString(uts.Release[:]))
}

func parseRelease(rel string) ([2]uint64, error) {
	var v [2]uint64
	if _, err := fmt.Sscanf(rel, "%d.%d", &v[0], &v[1]); err != nil {
		return v, fmt.Errorf("parsing kernel release %q: %w", rel, err)
	}
	return v, nil
}
