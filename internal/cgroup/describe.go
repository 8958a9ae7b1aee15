package cgroup

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// describeFiles are the control files Describe reports, each where it
// exists: what a group's memory use, limits, task count and freezer state
// come from on v1 and v2.
var describeFiles = []string{
	"memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes",
	"memory.failcnt", "memory.swappiness", "memory.move_charge_at_immigrate",
	"memory.current", "memory.peak", "memory.max", "memory.swap.max", "memory.events",
	"pids.current", "pids.max", "pids.events",
	"cpu.cfs_quota_us", "cpu.shares", "cpu.max", "cpu.weight",
	"freezer.state", "cgroup.freeze",
}

// describeStatKeys are the memory.stat lines Describe reports: where the
// group's memory is (anonymous, page cache, swap), its own and, on v1,
// with its descendants'.
var describeStatKeys = []string{"rss", "cache", "swap", "total_rss", "total_cache", "total_swap", "anon", "file"}

// Describe reports, for a person reading a failure, what the group holds
// now on every hierarchy: each directory, its control files of memory,
// tasks, CPU and freezing (those that exist), the memory.stat lines of
// where its memory is, the OOM kills, and each of its processes with its
// name, state, resident memory and the cgroups /proc says it is in. It
// reads only, and reports what it cannot read in place of the value.
func (g *Group) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cgroup %s (v%d):\n", g.id, g.m.Version())
	ctrls := make([]string, 0, len(g.dirs))
	for c := range g.dirs {
		ctrls = append(ctrls, c)
	}
	slices.Sort(ctrls)
	seen := map[string]bool{}
	var pids []int
	for _, c := range ctrls {
		d := g.dirs[c]
		if seen[d] {
			continue
		}
		seen[d] = true
		fmt.Fprintf(&b, "  %s\n", d)
		if _, err := os.Lstat(d); err != nil {
			fmt.Fprintf(&b, "    %v\n", err)
			continue
		}
		for _, f := range describeFiles {
			v, err := readFile(d, f)
			if err == nil {
				fmt.Fprintf(&b, "    %s: %s\n", f, strings.Join(strings.Fields(string(v)), " "))
			}
		}
		if st, err := readFile(d, "memory.stat"); err == nil {
			have := map[string]string{}
			for line := range strings.Lines(string(st)) {
				if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
					have[k] = v
				}
			}
			var kv []string
			for _, k := range describeStatKeys {
				if v, ok := have[k]; ok {
					kv = append(kv, k+" "+v)
				}
			}
			fmt.Fprintf(&b, "    memory.stat: %s\n", strings.Join(kv, ", "))
		}
		if n, err := readKey(d, "memory.oom_control", "oom_kill"); err == nil {
			fmt.Fprintf(&b, "    memory.oom_control oom_kill: %d\n", n)
		}
		p, err := readPids(d)
		if err != nil {
			fmt.Fprintf(&b, "    cgroup.procs: %v\n", err)
			continue
		}
		fmt.Fprintf(&b, "    cgroup.procs: %v\n", p)
		pids = append(pids, p...)
	}
	slices.Sort(pids)
	for _, pid := range slices.Compact(pids) {
		fmt.Fprintf(&b, "  process %d: %s\n", pid, describeProc(pid))
	}
	return b.String()
}

// describeProc is one process's name, state, resident memory and cgroups.
func describeProc(pid int) string {
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return err.Error()
	}
	var parts []string
	for line := range strings.Lines(string(status)) {
		k, v, _ := strings.Cut(line, ":")
		if k == "Name" || k == "State" || k == "VmRSS" || k == "NSpid" {
			parts = append(parts, k+" "+strings.Join(strings.Fields(v), " "))
		}
	}
	if cg, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup"); err == nil {
		parts = append(parts, "cgroups "+strings.Join(strings.Fields(string(cg)), " "))
	}
	return strings.Join(parts, "; ")
}
