package seccomp

import (
	"fmt"
	"slices"

	moby "github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Seccomp return values (linux/seccomp.h).
const (
	retAllow       = unix.SECCOMP_RET_ALLOW
	retKillProcess = unix.SECCOMP_RET_KILL_PROCESS
	retErrno       = unix.SECCOMP_RET_ERRNO
)

func errnoAction(e unix.Errno) uint32 { return retErrno | uint32(e)&unix.SECCOMP_RET_DATA }

// op is an argument comparison, as in libseccomp's SCMP_CMP_*.
type op int

const (
	opEQ       op = iota // arg == val
	opNE                 // arg != val
	opLT                 // arg < val (unsigned)
	opLE                 // arg <= val
	opGT                 // arg > val
	opGE                 // arg >= val
	opMaskedEQ           // arg & val == val2
)

// cond is one comparison of a syscall argument. With low32 only the low 32
// bits of the argument take part; use it for arguments the kernel reads as
// 32-bit (ioctl's request), so garbage in the high half cannot dodge a deny
// rule (CVE-2019-10063).
type cond struct {
	arg   uint // 0..5
	op    op
	val   uint64
	val2  uint64
	low32 bool
}

// rule applies act when every cond holds (an empty list always holds).
type rule struct {
	conds []cond
	act   uint32
}

// policy maps a syscall name to its rules, tried in order; the first rule
// that holds decides. A syscall with no matching rule gets defaultAct.
type policy struct {
	defaultAct uint32
	rules      map[string][]rule
}

// nsCloneFlags are the clone(2) flags that create namespaces. CLONE_NEWTIME
// is absent: in clone(2) its bit is part of the exit signal (CSIGNAL).
const nsCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// Syscalls fence denies on top of Docker's profile, with the errno they get.
var (
	// ENOSYS makes callers fall back: libuv to epoll, glibc to clone(2),
	// whose flags the filter can inspect.
	fenceENOSYS = []string{"io_uring_setup", "io_uring_enter", "io_uring_register", "clone3"}
	fenceEPERM  = []string{
		"ptrace", "process_vm_readv", "process_vm_writev",
		"userfaultfd", "bpf", "perf_event_open",
		"keyctl", "add_key", "request_key",
		"unshare", "setns",
		"mount", "umount", "umount2", "pivot_root", "mount_setattr", "move_mount",
		"open_tree", "open_tree_attr", "fsopen", "fsconfig", "fsmount", "fspick",
	}
	// personality values Docker allows that fence does not: UNAME26 (0x8)
	// and ADDR_NO_RANDOMIZE (0x20000), which turns ASLR off. PER_LINUX (0)
	// and the query value 0xffffffff stay.
	deniedPersonalities = []uint64{0x0008, 0x20000, 0x20008}
	// ioctl requests that inject into or reconfigure a terminal.
	deniedIoctls = []uint64{unix.TIOCSTI, unix.TIOCLINUX}
	// The flags argument of the socket send/receive calls, where MSG_OOB
	// is refused: out-of-band data on unix sockets reaches kernel code
	// with a history of use-after-frees (CVE-2025-38236); Chrome's sandbox
	// refuses it the same way. TCP urgent data goes with it.
	// The mode argument of the calls that set a file's mode, where the
	// set-user-ID and set-group-ID bits are refused: under no_new_privs
	// they do nothing inside a sandbox, and in a directory bound from the
	// host they would plant a set-id program there. (mkdir keeps setgid,
	// which on a directory only passes its group on.)
	setIDModeArg = map[string]uint{
		"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2,
		"open": 2, "openat": 3, "creat": 1, "mknod": 1, "mknodat": 2,
	}
	oobFlagsArg = map[string]uint{
		"sendto": 3, "recvfrom": 3, "sendmsg": 2, "recvmsg": 2, "sendmmsg": 3, "recvmmsg": 3,
	}
)

// fencePolicy resolves Docker's default profile for arch ("amd64", "arm64")
// and kernel with no capabilities, then applies fence's changes.
func fencePolicy(arch string, kernel [2]uint64) (*policy, error) {
	p, err := resolveMoby(moby.DefaultProfile(), arch, kernel, nil)
	if err != nil {
		return nil, fmt.Errorf("resolving docker's default profile: %w", err)
	}
	for _, n := range fenceENOSYS {
		p.rules[n] = []rule{{act: errnoAction(unix.ENOSYS)}}
	}
	for _, n := range fenceEPERM {
		p.rules[n] = []rule{{act: errnoAction(unix.EPERM)}}
	}
	// clone: fence's own rule rather than trusting the profile's.
	p.rules["clone"] = []rule{{
		conds: []cond{{arg: 0, op: opMaskedEQ, val: nsCloneFlags, val2: 0}},
		act:   retAllow,
	}}
	p.rules["personality"] = slices.DeleteFunc(p.rules["personality"], func(r rule) bool {
		return len(r.conds) == 1 && r.conds[0].op == opEQ && slices.Contains(deniedPersonalities, r.conds[0].val)
	})
	var ioctl []rule
	for _, req := range deniedIoctls {
		ioctl = append(ioctl, rule{
			conds: []cond{{arg: 1, op: opEQ, val: req, low32: true}},
			act:   errnoAction(unix.EPERM),
		})
	}
	p.rules["ioctl"] = append(ioctl, p.rules["ioctl"]...)
	for name, arg := range setIDModeArg {
		p.denyBits(name, arg, unix.S_ISUID, unix.S_ISGID)
	}
	// openat2 carries its mode in a struct the filter cannot read: ENOSYS
	// sends callers back to openat.
	p.rules["openat2"] = []rule{{act: errnoAction(unix.ENOSYS)}}
	for name, arg := range oobFlagsArg {
		p.denyBits(name, arg, unix.MSG_OOB)
	}
	// socket and socketpair: fence's own family list rather than Docker's.
	// Creating a socket of a family the kernel has as a module loads that
	// module on the host (TIPC, RDS, CAN, KCM, SMC, ...), so only the
	// families a sandbox needs reach the kernel; netlink only for routing
	// (getifaddrs, ip) and socket diagnostics (ss); IP only with built-in
	// protocols. The errnos are the ones the kernel gives a family or
	// protocol it lacks.
	p.rules["socket"] = socketRules()
	p.rules["socketpair"] = socketRules()
	return p, nil
}

// The socket families a sandbox may create, each with the protocols it may
// ask for (nil: any). An IP socket's protocol is limited too: the kernel
// loads a module for a protocol it lacks (socket(AF_INET, SOCK_STREAM,
// IPPROTO_SCTP) loads sctp), whereas 0, TCP, UDP, ICMP (ping sockets) and
// MPTCP are built in.
var socketFamilies = []struct {
	family uint64
	protos []uint64
}{
	{unix.AF_UNIX, nil},
	{unix.AF_INET, []uint64{0, unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMP, unix.IPPROTO_MPTCP}},
	{unix.AF_INET6, []uint64{0, unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMPV6, unix.IPPROTO_MPTCP}},
	{unix.AF_NETLINK, []uint64{unix.NETLINK_ROUTE, unix.NETLINK_SOCK_DIAG}},
}

// socketRules returns the rules of socket(domain, type, protocol) and
// socketpair (same first three arguments). Both halves of each argument
// are compared: garbage in the high half is refused, not ignored.
func socketRules() []rule {
	var rs []rule
	for _, f := range socketFamilies {
		fam := cond{arg: 0, op: opEQ, val: f.family}
		if f.protos == nil {
			rs = append(rs, rule{conds: []cond{fam}, act: retAllow})
			continue
		}
		for _, proto := range f.protos {
			rs = append(rs, rule{conds: []cond{fam, {arg: 2, op: opEQ, val: proto}}, act: retAllow})
		}
		rs = append(rs, rule{conds: []cond{fam}, act: errnoAction(unix.EPROTONOSUPPORT)})
	}
	return append(rs, rule{act: errnoAction(unix.EAFNOSUPPORT)})
}

// denyBits makes syscall name fail with EPERM, before any other rule of
// it, when argument arg has any of bits set (low 32 bits: these are int
// flags and modes, so garbage in the high half cannot dodge the rule).
func (p *policy) denyBits(name string, arg uint, bits ...uint64) {
	deny := make([]rule, 0, len(bits))
	for _, bit := range bits {
		deny = append(deny, rule{
			conds: []cond{{arg: arg, op: opMaskedEQ, val: bit, val2: bit, low32: true}},
			act:   errnoAction(unix.EPERM),
		})
	}
	p.rules[name] = append(deny, p.rules[name]...)
}

// resolveMoby turns a moby profile into a policy the way moby's
// setupSeccomp does (includes/excludes by arch, capability and minimum
// kernel), for the given arch, kernel and bounding capability set.
// Conditions of one rule are ANDed (libseccomp semantics).
func resolveMoby(prof *moby.Seccomp, arch string, kernel [2]uint64, caps []string) (*policy, error) {
	def, err := mobyAction(prof.DefaultAction, prof.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("default action: %w", err)
	}
	p := &policy{defaultAct: def, rules: map[string][]rule{}}
	kernelAtLeast := func(v *moby.KernelVersion) bool {
		return kernel[0] > v.Kernel || (kernel[0] == v.Kernel && kernel[1] >= v.Major)
	}
	for _, sc := range prof.Syscalls {
		if ex := sc.Excludes; ex != nil {
			if slices.Contains(ex.Arches, arch) ||
				slices.ContainsFunc(ex.Caps, func(c string) bool { return slices.Contains(caps, c) }) ||
				(ex.MinKernel != nil && kernelAtLeast(ex.MinKernel)) {
				continue
			}
		}
		if in := sc.Includes; in != nil {
			if (len(in.Arches) > 0 && !slices.Contains(in.Arches, arch)) ||
				slices.ContainsFunc(in.Caps, func(c string) bool { return !slices.Contains(caps, c) }) ||
				(in.MinKernel != nil && !kernelAtLeast(in.MinKernel)) {
				continue
			}
		}
		act, err := mobyAction(sc.Action, sc.ErrnoRet)
		if err != nil {
			return nil, fmt.Errorf("syscalls %v: %w", sc.Names, err)
		}
		r := rule{act: act}
		for _, a := range sc.Args {
			c, err := mobyCond(a)
			if err != nil {
				return nil, fmt.Errorf("syscalls %v: %w", sc.Names, err)
			}
			r.conds = append(r.conds, c)
		}
		names := sc.Names
		//lint:ignore SA1019 profiles written for older runtimes still name one syscall in Name
		if n := sc.Name; n != "" {
			names = append(slices.Clone(names), n)
		}
		for _, n := range names {
			p.rules[n] = append(p.rules[n], r)
		}
	}
	return p, nil
}

func mobyAction(a specs.LinuxSeccompAction, errnoRet *uint) (uint32, error) {
	switch a {
	case specs.ActAllow:
		return retAllow, nil
	case specs.ActErrno:
		e := unix.EPERM
		if errnoRet != nil {
			e = unix.Errno(*errnoRet)
		}
		return errnoAction(e), nil
	case specs.ActKillProcess:
		return retKillProcess, nil
	}
	return 0, fmt.Errorf("unsupported action %q", a)
}

func mobyCond(a specs.LinuxSeccompArg) (cond, error) {
	if a.Index > 5 {
		return cond{}, fmt.Errorf("argument index %d out of range", a.Index)
	}
	c := cond{arg: a.Index, val: a.Value, val2: a.ValueTwo}
	switch a.Op {
	case specs.OpEqualTo:
		c.op = opEQ
	case specs.OpNotEqual:
		c.op = opNE
	case specs.OpLessThan:
		c.op = opLT
	case specs.OpLessEqual:
		c.op = opLE
	case specs.OpGreaterThan:
		c.op = opGT
	case specs.OpGreaterEqual:
		c.op = opGE
	case specs.OpMaskedEqual:
		c.op = opMaskedEQ
	default:
		return cond{}, fmt.Errorf("unsupported operator %q", a.Op)
	}
	return c, nil
}
