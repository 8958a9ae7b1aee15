package capacity

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Knob is a kernel setting that bounds how many sandboxes a node holds.
type Knob struct {
	Name string // sysctl name, e.g. "kernel.pid_max"
	Path string // under /proc/sys
	// Per is how much of the knob one sandbox takes (0: not per sandbox),
	// and Limit the admission limit it bounds, whose SafetyMargin stays
	// free ("" for none).
	Per   int64
	Limit Limit
	// Tuned is the value --tune-kernel raises it to (0: left alone).
	Tuned int64
	// Bounds says what it bounds.
	Bounds string
}

// Knobs are the kernel settings fence serve reads at start.
var Knobs = []Knob{
	{Name: "kernel.pid_max", Path: "kernel/pid_max", Per: PerSandbox[Tasks], Limit: Tasks, Tuned: 4194304,
		Bounds: "tasks (processes and threads) of the whole host"},
	{Name: "kernel.threads-max", Path: "kernel/threads-max", Per: PerSandbox[Tasks], Limit: Tasks,
		Bounds: "tasks of the whole host (set by the kernel from memory)"},
	{Name: "user.max_user_namespaces", Path: "user/max_user_namespaces", Per: 1,
		Bounds: "user namespaces: one per native sandbox"},
	{Name: "fs.inotify.max_user_instances", Path: "fs/inotify/max_user_instances", Per: 0, Tuned: 8192,
		Bounds: "inotify instances of one uid: each filesystem watch of a sandbox takes one"},
	{Name: "fs.inotify.max_user_watches", Path: "fs/inotify/max_user_watches", Per: 0, Tuned: 1048576,
		Bounds: "inotify watches of one uid: one per directory a recursive watch follows"},
	{Name: "fs.nr_open", Path: "fs/nr_open", Per: PerSandbox[DaemonFiles], Limit: DaemonFiles,
		Bounds: "the most RLIMIT_NOFILE may be raised to: the daemon's descriptors"},
}

// KnobValue is a knob as read, with the sandboxes it allows.
type KnobValue struct {
	Knob
	Value int64
	// Sandboxes is what Value holds beyond its Limit's SafetyMargin at Per
	// each, 0 when the knob is not per sandbox.
	Sandboxes int64
}

// ReadKnobs reads Knobs under proc (empty: /proc); a knob that cannot be
// read is left out.
func ReadKnobs(proc string) []KnobValue {
	if proc == "" {
		proc = "/proc"
	}
	var out []KnobValue
	for _, k := range Knobs {
		v, ok := readInt(proc + "/sys/" + k.Path)
		if !ok {
			continue
		}
		kv := KnobValue{Knob: k, Value: v}
		if k.Per > 0 {
			kv.Sandboxes = Left(Reading{Max: v}, k.Per, SafetyMargin[k.Limit])
		}
		out = append(out, kv)
	}
	return out
}

// Tune raises the knobs that have a Tuned value to it, under proc (empty:
// /proc); a knob already at or above it is left alone. It returns what it
// changed as "name old → new".
func Tune(proc string) ([]string, error) {
	if proc == "" {
		proc = "/proc"
	}
	var changed []string
	for _, k := range Knobs {
		if k.Tuned == 0 {
			continue
		}
		path := proc + "/sys/" + k.Path
		v, ok := readInt(path)
		if ok && v >= k.Tuned {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.FormatInt(k.Tuned, 10)), 0o644); err != nil {
			return changed, fmt.Errorf("raising %s to %d: %w", k.Name, k.Tuned, err)
		}
		changed = append(changed, fmt.Sprintf("%s %d → %d", k.Name, v, k.Tuned))
	}
	return changed, nil
}

// RaiseNoFile raises this process's RLIMIT_NOFILE, soft and hard, to n
// (fs.nr_open is the most the kernel allows; raising the hard limit takes
// CAP_SYS_RESOURCE), as a service manager's LimitNOFILE does: each idle
// sandbox holds a few of the daemon's descriptors, and the descriptor
// limit, not memory, then bounds how many a node holds. A limit already at
// or above n is left alone. It returns what it changed as "name old → new"
// ("" if nothing).
func RaiseNoFile(n uint64) (string, error) {
	var cur unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &cur); err != nil {
		return "", fmt.Errorf("reading RLIMIT_NOFILE: %w", err)
	}
	if cur.Cur >= n && cur.Max >= n {
		return "", nil
	}
	next := unix.Rlimit{Cur: max(cur.Cur, n), Max: max(cur.Max, n)}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &next); err != nil {
		return "", fmt.Errorf("raising RLIMIT_NOFILE to %d: %w", n, err)
	}
	return fmt.Sprintf("RLIMIT_NOFILE %d → %d", cur.Cur, next.Cur), nil
}
