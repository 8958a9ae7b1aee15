package seccomp

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	moby "github.com/moby/profiles/seccomp"
	"golang.org/x/sys/unix"
)

// data is a struct seccomp_data.
type data struct {
	nr   uint32
	arch uint32
	args [6]uint64
}

func (d data) bytes() []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint32(b[0:], d.nr)
	binary.LittleEndian.PutUint32(b[4:], d.arch)
	for i, a := range d.args {
		binary.LittleEndian.PutUint64(b[16+8*i:], a)
	}
	return b
}

// run interprets the classic BPF subset the compiler emits, refusing
// anything else, including backward or out-of-range jumps.
func run(prog []unix.SockFilter, d data) (uint32, error) {
	mem := d.bytes()
	var acc uint32
	for pc := 0; pc < len(prog); {
		in := prog[pc]
		next := pc + 1
		switch in.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			if in.K%4 != 0 || in.K+4 > uint32(len(mem)) {
				return 0, fmt.Errorf("pc %d: bad load offset %d", pc, in.K)
			}
			acc = binary.LittleEndian.Uint32(mem[in.K:])
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_K:
			acc &= in.K
		case unix.BPF_RET | unix.BPF_K:
			return in.K, nil
		case unix.BPF_JMP | unix.BPF_JA:
			next += int(in.K)
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			var ok bool
			switch in.Code & 0xf0 {
			case unix.BPF_JEQ:
				ok = acc == in.K
			case unix.BPF_JGT:
				ok = acc > in.K
			case unix.BPF_JGE:
				ok = acc >= in.K
			case unix.BPF_JSET:
				ok = acc&in.K != 0
			}
			if ok {
				next += int(in.Jt)
			} else {
				next += int(in.Jf)
			}
		default:
			return 0, fmt.Errorf("pc %d: unexpected opcode %#x", pc, in.Code)
		}
		pc = next
	}
	return 0, fmt.Errorf("fell off the end of the program")
}

// eval is the reference semantics of a policy.
func eval(p *policy, arch archInfo, d data) uint32 {
	if d.arch != arch.auditArch || (arch.x32 && d.nr&x32Bit != 0 && d.nr != 0xffffffff) {
		return retKillProcess
	}
	for name, rules := range p.rules {
		if nr, ok := arch.sysnum[name]; !ok || nr != d.nr {
			continue
		}
	rules:
		for _, r := range rules {
			for _, c := range r.conds {
				if !holds(c, d.args[c.arg]) {
					continue rules
				}
			}
			return r.act
		}
	}
	return p.defaultAct
}

func holds(c cond, v uint64) bool {
	val, val2 := c.val, c.val2
	if c.low32 {
		v, val, val2 = uint64(uint32(v)), uint64(uint32(val)), uint64(uint32(val2))
	}
	switch c.op {
	case opEQ:
		return v == val
	case opNE:
		return v != val
	case opLT:
		return v < val
	case opLE:
		return v <= val
	case opGT:
		return v > val
	case opGE:
		return v >= val
	case opMaskedEQ:
		return v&val == val2
	}
	panic("unknown op")
}

var (
	eperm  = errnoAction(unix.EPERM)
	enosys = errnoAction(unix.ENOSYS)

	eafnosupport    = errnoAction(unix.EAFNOSUPPORT)
	eprotonosupport = errnoAction(unix.EPROTONOSUPPORT)
)

func actName(a uint32) string {
	switch {
	case a == retAllow:
		return "ALLOW"
	case a == retKillProcess:
		return "KILL_PROCESS"
	case a&unix.SECCOMP_RET_ACTION_FULL == retErrno:
		return fmt.Sprintf("ERRNO(%s)", unix.ErrnoName(unix.Errno(a&unix.SECCOMP_RET_DATA)))
	}
	return fmt.Sprintf("%#x", a)
}

func fenceProgram(t *testing.T, arch string) (*policy, archInfo, []unix.SockFilter) {
	t.Helper()
	ai := arches[arch]
	p, err := fencePolicy(arch, [2]uint64{6, 18})
	if err != nil {
		t.Fatalf("fencePolicy(%s) error: %v", arch, err)
	}
	prog, err := compile(p, ai)
	if err != nil {
		t.Fatalf("compile(%s) error: %v", arch, err)
	}
	if len(prog) > maxInsns {
		t.Fatalf("len(prog) = %d, want <= %d", len(prog), maxInsns)
	}
	t.Logf("%s program: %d instructions", arch, len(prog))
	return p, ai, prog
}

func TestFenceProgramAMD64(t *testing.T) {
	_, _, prog := fenceProgram(t, "amd64")
	x86 := uint32(unix.AUDIT_ARCH_X86_64)
	sys := func(name string, args ...uint64) data {
		nr, ok := sysnumAMD64[name]
		if !ok {
			t.Fatalf("unknown syscall %s", name)
		}
		d := data{nr: nr, arch: x86}
		copy(d.args[:], args)
		return d
	}
	const hi = 0xdeadbeef00000000
	tests := []struct {
		name string
		d    data
		want uint32
	}{
		{"i386 getpid", data{nr: 20, arch: unix.AUDIT_ARCH_I386}, retKillProcess},
		{"i386 mount", data{nr: 21, arch: unix.AUDIT_ARCH_I386}, retKillProcess},
		{"aarch64 arch", data{nr: 172, arch: unix.AUDIT_ARCH_AARCH64}, retKillProcess},
		{"x32 getpid", data{nr: x32Bit | 39, arch: x86}, retKillProcess},
		{"x32 unknown", data{nr: x32Bit | 547, arch: x86}, retKillProcess},
		{"getpid", sys("getpid"), retAllow},
		{"read", sys("read"), retAllow},
		{"execve", sys("execve"), retAllow},
		{"unknown nr", data{nr: 1000, arch: x86}, eperm},
		{"nr -1", data{nr: 0xffffffff, arch: x86}, eperm},
		{"socket AF_UNIX", sys("socket", unix.AF_UNIX), retAllow},
		{"socket AF_INET", sys("socket", unix.AF_INET), retAllow},
		{"socket AF_INET6", sys("socket", unix.AF_INET6), retAllow},
		{"socket AF_NETLINK ROUTE", sys("socket", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE), retAllow},
		{"socket AF_NETLINK SOCK_DIAG", sys("socket", unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_SOCK_DIAG), retAllow},
		{"socket AF_NETLINK XFRM", sys("socket", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_XFRM), eprotonosupport},
		{"socket AF_NETLINK AUDIT", sys("socket", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT), eprotonosupport},
		{"socket AF_NETLINK NETFILTER", sys("socket", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER), eprotonosupport},
		{"socket AF_NETLINK KOBJECT_UEVENT", sys("socket", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_KOBJECT_UEVENT), eprotonosupport},
		{"socket AF_NETLINK ROUTE high bits", sys("socket", unix.AF_NETLINK, unix.SOCK_RAW, hi|unix.NETLINK_ROUTE), eprotonosupport},
		{"socket AF_UNSPEC", sys("socket", unix.AF_UNSPEC), eafnosupport},
		{"socket AF_ALG", sys("socket", unix.AF_ALG), eafnosupport},
		{"socket AF_VSOCK", sys("socket", unix.AF_VSOCK), eafnosupport},
		{"socket AF_AX25", sys("socket", 3), eafnosupport},
		{"socket AF_PACKET", sys("socket", unix.AF_PACKET), eafnosupport},
		{"socket AF_KEY", sys("socket", unix.AF_KEY), eafnosupport},
		{"socket AF_TIPC", sys("socket", unix.AF_TIPC), eafnosupport},
		{"socket AF_RDS", sys("socket", unix.AF_RDS), eafnosupport},
		{"socket AF_CAN", sys("socket", unix.AF_CAN), eafnosupport},
		{"socket AF_BLUETOOTH", sys("socket", unix.AF_BLUETOOTH), eafnosupport},
		{"socket AF_KCM", sys("socket", unix.AF_KCM), eafnosupport},
		{"socket AF_SMC", sys("socket", unix.AF_SMC), eafnosupport},
		{"socket AF_RXRPC", sys("socket", unix.AF_RXRPC), eafnosupport},
		{"socket AF_XDP", sys("socket", unix.AF_XDP), eafnosupport},
		{"socket 46", sys("socket", 46), eafnosupport},
		{"socket AF_INET high bits", sys("socket", hi|unix.AF_INET), eafnosupport},
		{"socket AF_INET TCP", sys("socket", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_TCP), retAllow},
		{"socket AF_INET6 UDP", sys("socket", unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_UDP), retAllow},
		{"socket AF_INET ping", sys("socket", unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP), retAllow},
		{"socket AF_INET6 ping", sys("socket", unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_ICMPV6), retAllow},
		{"socket AF_INET MPTCP", sys("socket", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP), retAllow},
		{"socket AF_INET SCTP", sys("socket", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP), eprotonosupport},
		{"socket AF_INET6 DCCP", sys("socket", unix.AF_INET6, unix.SOCK_DCCP, unix.IPPROTO_DCCP), eprotonosupport},
		{"socket AF_INET L2TP", sys("socket", unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_L2TP), eprotonosupport},
		{"socket AF_INET TCP high bits", sys("socket", unix.AF_INET, unix.SOCK_STREAM, hi|unix.IPPROTO_TCP), eprotonosupport},
		{"socket AF_UNIX any protocol", sys("socket", unix.AF_UNIX, unix.SOCK_STREAM, 7), retAllow},
		{"socketpair AF_UNIX", sys("socketpair", unix.AF_UNIX), retAllow},
		{"socketpair AF_TIPC", sys("socketpair", unix.AF_TIPC), eafnosupport},
		{"socketpair AF_NETLINK XFRM", sys("socketpair", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_XFRM), eprotonosupport},
		{"ioctl TIOCGWINSZ", sys("ioctl", 0, unix.TIOCGWINSZ), retAllow},
		{"ioctl TIOCSTI", sys("ioctl", 0, unix.TIOCSTI), eperm},
		{"ioctl TIOCSTI high bits", sys("ioctl", 0, hi|unix.TIOCSTI), eperm},
		{"ioctl TIOCLINUX", sys("ioctl", 0, unix.TIOCLINUX), eperm},
		{"ioctl TIOCLINUX high bits", sys("ioctl", 0, 0xffffffff00000000|unix.TIOCLINUX), eperm},
		{"clone fork", sys("clone", uint64(unix.SIGCHLD)), retAllow},
		{"clone thread", sys("clone", unix.CLONE_VM|unix.CLONE_FS|unix.CLONE_FILES|unix.CLONE_SIGHAND|unix.CLONE_THREAD|unix.CLONE_SYSVSEM|unix.CLONE_SETTLS|unix.CLONE_PARENT_SETTID|unix.CLONE_CHILD_CLEARTID), retAllow},
		{"clone vfork pidfd", sys("clone", unix.CLONE_VM|unix.CLONE_VFORK|unix.CLONE_PIDFD|uint64(unix.SIGCHLD)), retAllow},
		{"clone NEWUSER", sys("clone", unix.CLONE_NEWUSER|uint64(unix.SIGCHLD)), eperm},
		{"clone NEWNS", sys("clone", unix.CLONE_NEWNS), eperm},
		{"clone NEWNET", sys("clone", unix.CLONE_NEWNET), eperm},
		{"clone NEWCGROUP", sys("clone", unix.CLONE_NEWCGROUP), eperm},
		{"clone3", sys("clone3"), enosys},
		{"io_uring_setup", sys("io_uring_setup"), enosys},
		{"io_uring_enter", sys("io_uring_enter"), enosys},
		{"io_uring_register", sys("io_uring_register"), enosys},
		{"unshare", sys("unshare", unix.CLONE_NEWUSER), eperm},
		{"unshare no flags", sys("unshare", 0), eperm},
		{"setns", sys("setns"), eperm},
		{"mount", sys("mount"), eperm},
		{"umount2", sys("umount2"), eperm},
		{"fsopen", sys("fsopen"), eperm},
		{"open_tree", sys("open_tree"), eperm},
		{"open_tree_attr", sys("open_tree_attr"), eperm},
		{"move_mount", sys("move_mount"), eperm},
		{"pivot_root", sys("pivot_root"), eperm},
		{"keyctl", sys("keyctl"), eperm},
		{"add_key", sys("add_key"), eperm},
		{"request_key", sys("request_key"), eperm},
		{"bpf", sys("bpf"), eperm},
		{"perf_event_open", sys("perf_event_open"), eperm},
		{"userfaultfd", sys("userfaultfd"), eperm},
		{"ptrace", sys("ptrace"), eperm},
		{"process_vm_readv", sys("process_vm_readv"), eperm},
		{"process_vm_writev", sys("process_vm_writev"), eperm},
		{"personality 0", sys("personality", 0), retAllow},
		{"personality query", sys("personality", 0xffffffff), retAllow},
		{"personality ADDR_NO_RANDOMIZE", sys("personality", 0x20000), eperm},
		{"personality UNAME26", sys("personality", 0x8), eperm},
		{"arch_prctl", sys("arch_prctl"), retAllow},
		{"seccomp", sys("seccomp"), retAllow},
		{"init_module", sys("init_module"), eperm},
		{"kexec_load", sys("kexec_load"), eperm},
		{"reboot", sys("reboot"), eperm},
		{"chroot", sys("chroot"), eperm},
		{"open_by_handle_at", sys("open_by_handle_at"), eperm},
		{"_sysctl", sys("_sysctl"), eperm},
	}
	for _, tt := range tests {
		got, err := run(prog, tt.d)
		if err != nil {
			t.Errorf("%s: run error: %v", tt.name, err)
			continue
		}
		if got != tt.want {
			t.Errorf("%s: run(%+v) = %s, want %s", tt.name, tt.d, actName(got), actName(tt.want))
		}
	}
}

func TestFenceProgramARM64(t *testing.T) {
	_, _, prog := fenceProgram(t, "arm64")
	a64 := uint32(unix.AUDIT_ARCH_AARCH64)
	tests := []struct {
		name string
		d    data
		want uint32
	}{
		{"getpid", data{nr: sysnumARM64["getpid"], arch: a64}, retAllow},
		{"arm compat", data{nr: 20, arch: unix.AUDIT_ARCH_ARM}, retKillProcess},
		{"x86_64 arch", data{nr: 39, arch: unix.AUDIT_ARCH_X86_64}, retKillProcess},
		{"mount", data{nr: sysnumARM64["mount"], arch: a64}, eperm},
		{"socket AF_VSOCK", data{nr: sysnumARM64["socket"], arch: a64, args: [6]uint64{unix.AF_VSOCK}}, eafnosupport},
		{"socket AF_TIPC", data{nr: sysnumARM64["socket"], arch: a64, args: [6]uint64{unix.AF_TIPC}}, eafnosupport},
		{"socket AF_INET", data{nr: sysnumARM64["socket"], arch: a64, args: [6]uint64{unix.AF_INET}}, retAllow},
		{"clone3", data{nr: sysnumARM64["clone3"], arch: a64}, enosys},
	}
	for _, tt := range tests {
		got, err := run(prog, tt.d)
		if err != nil {
			t.Errorf("%s: run error: %v", tt.name, err)
			continue
		}
		if got != tt.want {
			t.Errorf("%s: run(%+v) = %s, want %s", tt.name, tt.d, actName(got), actName(tt.want))
		}
	}
}

// interesting returns argument values around v, high half included.
func interesting(r *rand.Rand, vals ...uint64) uint64 {
	v := vals[r.IntN(len(vals))]
	switch r.IntN(8) {
	case 0:
		return v + 1
	case 1:
		return v - 1
	case 2:
		return v ^ 1<<32
	case 3:
		return v + 1<<32
	case 4:
		return v - 1<<32
	case 5:
		return r.Uint64()
	case 6:
		return uint64(r.Uint32())
	}
	return v
}

// TestProgramMatchesPolicy checks the compiled fence policy against the
// reference semantics on random inputs around every constant in it.
func TestProgramMatchesPolicy(t *testing.T) {
	for _, arch := range []string{"amd64", "arm64"} {
		p, ai, prog := fenceProgram(t, arch)
		checkAgainstPolicy(t, p, ai, prog, 20000)
	}
}

func checkAgainstPolicy(t *testing.T, p *policy, ai archInfo, prog []unix.SockFilter, n int) {
	t.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	var names []string
	consts := []uint64{0, 1, 0xffffffff, 1 << 63}
	for name, rules := range p.rules {
		if _, ok := ai.sysnum[name]; ok {
			names = append(names, name)
		}
		for _, rl := range rules {
			for _, c := range rl.conds {
				consts = append(consts, c.val, c.val2, c.val|c.val2)
			}
		}
	}
	slices.Sort(names)
	for i := range n {
		d := data{arch: ai.auditArch, nr: ai.sysnum[names[r.IntN(len(names))]]}
		switch i % 50 {
		case 0:
			d.nr = r.Uint32()
		case 1:
			d.arch = r.Uint32()
		}
		for j := range d.args {
			d.args[j] = interesting(r, consts...)
		}
		got, err := run(prog, d)
		if err != nil {
			t.Fatalf("run(%+v) error: %v", d, err)
		}
		if want := eval(p, ai, d); got != want {
			t.Fatalf("run(%+v) = %s, want %s", d, actName(got), actName(want))
		}
	}
}

// TestAllOperators compiles a synthetic policy using every operator, with
// values that differ in either 32-bit half, and enough rules that jumps
// need long-jump trampolines.
func TestAllOperators(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	p := &policy{defaultAct: eperm, rules: map[string][]rule{}}
	names := []string{"read", "write", "openat", "ioctl", "fcntl", "mmap"}
	for _, name := range names {
		for range 40 {
			var conds []cond
			for range 1 + r.IntN(3) {
				c := cond{arg: uint(r.IntN(6)), op: op(r.IntN(int(opMaskedEQ) + 1)), low32: r.IntN(4) == 0}
				c.val = []uint64{0, 5, 1 << 32, 0xffffffff, 0x1_00000005, r.Uint64()}[r.IntN(6)]
				c.val2 = c.val & r.Uint64()
				conds = append(conds, c)
			}
			act := []uint32{retAllow, eperm, enosys, retKillProcess}[r.IntN(4)]
			p.rules[name] = append(p.rules[name], rule{conds: conds, act: act})
		}
	}
	ai := arches["amd64"]
	prog, err := compile(p, ai)
	if err != nil {
		t.Fatalf("compile error: %v", err)
	}
	var ja int
	for _, in := range prog {
		if in.Code == unix.BPF_JMP|unix.BPF_JA && in.K > 255 {
			ja++
		}
	}
	if ja == 0 {
		t.Fatalf("program of %d instructions has no long jump; the test does not exercise trampolines", len(prog))
	}
	checkAgainstPolicy(t, p, ai, prog, 50000)
}

func TestAssemblerLongJump(t *testing.T) {
	var a assembler
	a.ldAbs(0)
	a.jump(unix.BPF_JEQ, 7, "yes", "")
	for range 300 {
		a.and(0xffffffff)
	}
	a.ret(1)
	a.label("yes")
	a.ret(2)
	prog, err := a.assemble()
	if err != nil {
		t.Fatalf("assemble error: %v", err)
	}
	for nr, want := range map[uint32]uint32{7: 2, 8: 1} {
		got, err := run(prog, data{nr: nr})
		if err != nil {
			t.Fatalf("run error: %v", err)
		}
		if got != want {
			t.Errorf("run(nr=%d) = %d, want %d", nr, got, want)
		}
	}
}

func TestAssemblerTooLong(t *testing.T) {
	var a assembler
	for range maxInsns + 1 {
		a.ret(0)
	}
	if _, err := a.assemble(); err == nil {
		t.Errorf("assemble(%d insns) error = nil, want error", maxInsns+1)
	}
}

func TestResolveMobyCaps(t *testing.T) {
	p, err := fencePolicy("amd64", [2]uint64{6, 18})
	if err != nil {
		t.Fatal(err)
	}
	// Capability-gated groups drop out with no capabilities.
	for _, name := range []string{"chroot", "reboot", "init_module", "syslog", "sethostname", "open_by_handle_at", "clock_settime"} {
		if rules, ok := p.rules[name]; ok {
			t.Errorf("rules[%s] = %+v, want none (capability-gated)", name, rules)
		}
	}
	// minKernel: ptrace's group needs 4.8; resolving for 4.4 must drop it
	// even before fence's own denial.
	old, err := resolveMoby(mobyDefault(), "amd64", [2]uint64{4, 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := old.rules["ptrace"]; ok {
		t.Errorf("resolveMoby(kernel 4.4).rules[ptrace] present, want absent")
	}
	cur, err := resolveMoby(mobyDefault(), "amd64", [2]uint64{6, 18}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cur.rules["ptrace"]; !ok {
		t.Errorf("resolveMoby(kernel 6.18).rules[ptrace] absent, want present")
	}
	// Arch includes: arch_prctl is x86 only, set_tls arm only.
	if _, ok := cur.rules["arch_prctl"]; !ok {
		t.Errorf("amd64 rules lack arch_prctl")
	}
	if _, ok := cur.rules["set_tls"]; ok {
		t.Errorf("amd64 rules have set_tls")
	}
	// With CAP_SYS_ADMIN the gated group appears.
	admin, err := resolveMoby(mobyDefault(), "amd64", [2]uint64{6, 18}, []string{"CAP_SYS_ADMIN"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := admin.rules["mount"]; !ok {
		t.Errorf("resolveMoby(CAP_SYS_ADMIN).rules[mount] absent, want present")
	}
}

func TestParseRelease(t *testing.T) {
	for rel, want := range map[string][2]uint64{"6.18.3-fc": {6, 18}, "3.12-1-amd64": {3, 12}, "4.8": {4, 8}} {
		got, err := parseRelease(rel)
		if err != nil || got != want {
			t.Errorf("parseRelease(%q) = %v, %v; want %v", rel, got, err, want)
		}
	}
	if _, err := parseRelease("garbage"); err == nil {
		t.Errorf("parseRelease(garbage) error = nil, want error")
	}
}

func mobyDefault() *moby.Seccomp { return moby.DefaultProfile() }
