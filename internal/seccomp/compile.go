package seccomp

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// Offsets in struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// x32Bit marks x32 ABI syscall numbers on x86_64 (__X32_SYSCALL_BIT).
const x32Bit = 0x40000000

// archInfo describes one native architecture the compiler supports. Both
// supported arches are little-endian: the low half of a 64-bit argument
// comes first in seccomp_data.
type archInfo struct {
	name      string // moby's arch name
	auditArch uint32
	x32       bool // kill syscall numbers with x32Bit set
	sysnum    map[string]uint32
}

var arches = map[string]archInfo{
	"amd64": {name: "amd64", auditArch: unix.AUDIT_ARCH_X86_64, x32: true, sysnum: sysnumAMD64},
	"arm64": {name: "arm64", auditArch: unix.AUDIT_ARCH_AARCH64, sysnum: sysnumARM64},
}

// compile turns p into a classic BPF seccomp program for arch. Any other
// audit arch (compat i386/arm, x32) is killed, since the rules are keyed
// by native syscall numbers. Syscall names unknown on arch are skipped.
func compile(p *policy, arch archInfo) ([]unix.SockFilter, error) {
	c := &compiler{rets: map[uint32]string{}}
	a := &c.a
	kill := c.retLabel(retKillProcess)
	def := c.retLabel(p.defaultAct)

	a.ldAbs(offArch)
	a.jump(unix.BPF_JEQ, arch.auditArch, "", kill)
	a.ldAbs(offNr)
	if arch.x32 {
		// x32 numbers carry x32Bit. -1 (a syscall skipped by a tracer, or
		// a probe) has it too and takes the default action, as with
		// libseccomp.
		notX32 := a.newLabel("native")
		a.jump(unix.BPF_JSET, x32Bit, "", notX32)
		a.jump(unix.BPF_JEQ, 0xffffffff, def, kill)
		a.label(notX32)
	}

	targets, bodies, err := c.targets(p, arch)
	if err != nil {
		return nil, err
	}
	c.tree(sortedKeys(targets), targets, def)
	for _, nr := range sortedKeys(bodies) {
		a.label(targets[nr])
		if err := c.body(bodies[nr]); err != nil {
			return nil, fmt.Errorf("syscall %d: %w", nr, err)
		}
		a.ja(def)
	}
	for _, act := range sortedKeys(c.rets) {
		a.label(c.rets[act])
		a.ret(act)
	}
	return a.assemble()
}

// targets gives, per syscall number of arch that p has rules for, where
// the dispatch jumps: straight to an action's ret when one rule without
// conditions decides, else to the number's body, whose rules it gives.
func (c *compiler) targets(p *policy, arch archInfo) (targets map[uint32]string, bodies map[uint32][]rule, err error) {
	targets = map[uint32]string{}
	bodies = map[uint32][]rule{}
	for name, rules := range p.rules {
		nr, ok := arch.sysnum[name]
		if !ok {
			continue
		}
		if _, dup := targets[nr]; dup {
			return nil, nil, fmt.Errorf("syscall %s: number %d listed twice", name, nr)
		}
		rules = simplify(rules, p.defaultAct)
		switch {
		case len(rules) == 0:
			continue
		case len(rules) == 1 && len(rules[0].conds) == 0:
			targets[nr] = c.retLabel(rules[0].act)
		default:
			targets[nr] = fmt.Sprintf("sys.%d", nr)
			bodies[nr] = rules
		}
	}
	return targets, bodies, nil
}

// body emits one syscall's rules in order: the first whose conditions all
// hold jumps to its action's ret; when none does, control falls through
// past the body.
func (c *compiler) body(rules []rule) error {
	a := &c.a
	for _, r := range rules {
		if len(r.conds) == 0 {
			a.ja(c.retLabel(r.act))
			break
		}
		next := a.newLabel("rule")
		for i, cd := range r.conds {
			t := c.retLabel(r.act)
			if i < len(r.conds)-1 {
				t = a.newLabel("cond")
			}
			if err := c.cond(cd, t, next); err != nil {
				return err
			}
			if i < len(r.conds)-1 {
				a.label(t)
			}
		}
		a.label(next)
	}
	return nil
}

// sortedKeys gives m's keys in increasing order.
func sortedKeys[V any](m map[uint32]V) []uint32 {
	keys := make([]uint32, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// simplify drops rules that can never decide: those after an
// unconditional rule, and trailing rules whose action is the default.
func simplify(rules []rule, def uint32) []rule {
	for i, r := range rules {
		if len(r.conds) == 0 {
			rules = rules[:i+1]
			break
		}
	}
	for len(rules) > 0 && rules[len(rules)-1].act == def {
		rules = rules[:len(rules)-1]
	}
	return rules
}

type compiler struct {
	a    assembler
	rets map[uint32]string // action → label of its ret instruction
}

func (c *compiler) retLabel(act uint32) string {
	if l, ok := c.rets[act]; ok {
		return l
	}
	l := fmt.Sprintf("ret.%#x", act)
	c.rets[act] = l
	return l
}

// tree emits a binary search over the sorted syscall numbers, with the
// number in the accumulator, jumping to targets[nr] or to def.
func (c *compiler) tree(nrs []uint32, targets map[uint32]string, def string) {
	a := &c.a
	if len(nrs) <= 4 {
		for _, nr := range nrs {
			a.jump(unix.BPF_JEQ, nr, targets[nr], "")
		}
		a.ja(def)
		return
	}
	mid := len(nrs) / 2
	right := a.newLabel("ge")
	a.jump(unix.BPF_JGE, nrs[mid], right, "")
	c.tree(nrs[:mid], targets, def)
	a.label(right)
	c.tree(nrs[mid:], targets, def)
}

// cond emits a test of one 64-bit argument, jumping to t if it holds and to
// f if not. Both 32-bit halves are compared unless cd.low32.
func (c *compiler) cond(cd cond, t, f string) error {
	if cd.arg > 5 {
		return fmt.Errorf("argument index %d out of range", cd.arg)
	}
	a := &c.a
	lo := uint32(offArgs + 8*cd.arg)
	hi := lo + 4
	vlo, vhi := uint32(cd.val), uint32(cd.val>>32)
	switch cd.op {
	case opEQ, opNE:
		if cd.op == opNE {
			t, f = f, t
		}
		if !cd.low32 {
			a.ldAbs(hi)
			a.jump(unix.BPF_JEQ, vhi, "", f)
		}
		a.ldAbs(lo)
		a.jump(unix.BPF_JEQ, vlo, t, f)
	case opGT, opGE, opLT, opLE:
		// LT is !GE and LE is !GT.
		lowCmp := uint16(unix.BPF_JGT)
		if cd.op == opGE || cd.op == opLT {
			lowCmp = unix.BPF_JGE
		}
		if cd.op == opLT || cd.op == opLE {
			t, f = f, t
		}
		if !cd.low32 {
			a.ldAbs(hi)
			a.jump(unix.BPF_JGT, vhi, t, "")
			a.jump(unix.BPF_JEQ, vhi, "", f)
		}
		a.ldAbs(lo)
		a.jump(lowCmp, vlo, t, f)
	case opMaskedEQ:
		mlo, mhi := uint32(cd.val), uint32(cd.val>>32)
		dlo, dhi := uint32(cd.val2), uint32(cd.val2>>32)
		if !cd.low32 {
			a.ldAbs(hi)
			a.and(mhi)
			a.jump(unix.BPF_JEQ, dhi, "", f)
		}
		a.ldAbs(lo)
		a.and(mlo)
		a.jump(unix.BPF_JEQ, dlo, t, f)
	default:
		return fmt.Errorf("unknown operator %d", cd.op)
	}
	return nil
}
