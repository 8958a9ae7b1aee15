package seccomp

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// maxInsns is the kernel's limit on a classic BPF program (BPF_MAXINSNS).
const maxInsns = 4096

// insn is one instruction of the symbolic program, before jump resolution.
// A conditional jump names its targets by label; "" is the next instruction.
type insn struct {
	op     uint16
	k      uint32
	jt, jf string // conditional jump targets
	target string // BPF_JA target
	label  string // when non-empty this is a label, not an instruction
}

func (i insn) isCond() bool {
	return i.label == "" && i.op&0x07 == unix.BPF_JMP && i.op&0xf0 != unix.BPF_JA
}

func (i insn) isJA() bool {
	return i.label == "" && i.op == unix.BPF_JMP|unix.BPF_JA
}

// assembler builds a forward-only classic BPF program with symbolic labels.
// Conditional jumps whose targets end up more than 255 instructions away are
// rewritten to jump to adjacent BPF_JA trampolines (32-bit offsets).
type assembler struct {
	ins  []insn
	next int // counter for generated labels
}

func (a *assembler) newLabel(prefix string) string {
	a.next++
	return fmt.Sprintf("%s.%d", prefix, a.next)
}

func (a *assembler) label(l string) { a.ins = append(a.ins, insn{label: l}) }

func (a *assembler) stmt(op uint16, k uint32) { a.ins = append(a.ins, insn{op: op, k: k}) }

func (a *assembler) ldAbs(off uint32) { a.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, off) }

func (a *assembler) and(k uint32) { a.stmt(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, k) }

func (a *assembler) ret(k uint32) { a.stmt(unix.BPF_RET|unix.BPF_K, k) }

// jump emits a conditional jump (BPF_JEQ, BPF_JGT, BPF_JGE or BPF_JSET).
func (a *assembler) jump(cond uint16, k uint32, jt, jf string) {
	a.ins = append(a.ins, insn{op: unix.BPF_JMP | cond | unix.BPF_K, k: k, jt: jt, jf: jf})
}

func (a *assembler) ja(l string) {
	a.ins = append(a.ins, insn{op: unix.BPF_JMP | unix.BPF_JA, target: l})
}

// assemble resolves labels and returns the program.
func (a *assembler) assemble() ([]unix.SockFilter, error) {
	ins := a.ins
	for {
		pos, labels, err := layout(ins)
		if err != nil {
			return nil, err
		}
		at := placement{pos: pos, labels: labels}
		out, grew, err := a.widen(ins, at)
		if err != nil {
			return nil, err
		}
		ins = out
		if !grew {
			// Every jump fits: emit.
			return emit(ins, at)
		}
	}
}

// placement is where a layout puts each entry and each label.
type placement struct {
	pos    []int          // each entry's instruction index
	labels map[string]int // each label's instruction index
}

// dist is the offset of a jump from entry from to label l (0 for "", the
// next instruction).
func (at placement) dist(from int, l string) (int, error) {
	if l == "" {
		return 0, nil
	}
	to, ok := at.labels[l]
	if !ok {
		return 0, fmt.Errorf("undefined label %q", l)
	}
	d := to - at.pos[from] - 1
	if d < 0 {
		return 0, fmt.Errorf("backward jump to %q", l)
	}
	return d, nil
}

// widen sends each conditional jump of ins (laid out at at) that is too
// far for an 8-bit offset through trampolines, and reports whether it
// added any (the layout then changes).
func (a *assembler) widen(ins []insn, at placement) (out []insn, grew bool, err error) {
	for i, in := range ins {
		if !in.isCond() {
			out = append(out, in)
			continue
		}
		dt, err := at.dist(i, in.jt)
		if err != nil {
			return nil, false, err
		}
		df, err := at.dist(i, in.jf)
		if err != nil {
			return nil, false, err
		}
		if dt <= 255 && df <= 255 {
			out = append(out, in)
			continue
		}
		grew = true
		far, tramp := a.trampolines(in, dt, df)
		out = append(out, far)
		out = append(out, tramp...)
	}
	return out, grew, nil
}

// trampolines rewrites conditional jump in, whose offsets are dt and df,
// to go through trampolines placed right after it for each target too
// far for an 8-bit offset.
func (a *assembler) trampolines(in insn, dt, df int) (insn, []insn) {
	var tramp []insn
	if dt > 255 {
		l := a.newLabel("far")
		tramp = append(tramp, insn{label: l}, insn{op: unix.BPF_JMP | unix.BPF_JA, target: in.jt})
		in.jt = l
	}
	if df > 255 {
		l := a.newLabel("far")
		tramp = append(tramp, insn{label: l}, insn{op: unix.BPF_JMP | unix.BPF_JA, target: in.jf})
		in.jf = l
	}
	// The trampolines are not reached by falling through: a
	// conditional jump always jumps, so neither path is "next"
	// unless its offset stays 0, which only a near target has.
	// A near "" target must skip the trampolines.
	if in.jt == "" || in.jf == "" {
		l := a.newLabel("near")
		if in.jt == "" {
			in.jt = l
		}
		if in.jf == "" {
			in.jf = l
		}
		tramp = append(tramp, insn{label: l})
	}
	return in, tramp
}

// emit encodes ins (laid out at at, every jump within reach), without its
// labels.
func emit(ins []insn, at placement) ([]unix.SockFilter, error) {
	prog := make([]unix.SockFilter, 0, len(at.pos))
	for i, in := range ins {
		if in.label != "" {
			continue
		}
		f := unix.SockFilter{Code: in.op, K: in.k}
		switch {
		case in.isCond():
			dt, _ := at.dist(i, in.jt)
			df, _ := at.dist(i, in.jf)
			f.Jt, f.Jf = uint8(dt), uint8(df)
		case in.isJA():
			d, err := at.dist(i, in.target)
			if err != nil {
				return nil, err
			}
			f.K = uint32(d)
		}
		prog = append(prog, f)
	}
	if len(prog) > maxInsns {
		return nil, fmt.Errorf("program has %d instructions, the kernel allows %d", len(prog), maxInsns)
	}
	return prog, nil
}

// layout returns each entry's instruction index (labels take the index of
// the next instruction) and the label table.
func layout(ins []insn) ([]int, map[string]int, error) {
	pos := make([]int, len(ins))
	labels := map[string]int{}
	n := 0
	for i, in := range ins {
		pos[i] = n
		if in.label != "" {
			if _, dup := labels[in.label]; dup {
				return nil, nil, fmt.Errorf("duplicate label %q", in.label)
			}
			labels[in.label] = n
			continue
		}
		n++
	}
	return pos, labels, nil
}
