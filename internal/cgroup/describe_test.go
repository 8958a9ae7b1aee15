package cgroup

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// Describe names every directory of the group, reads its memory and task
// control files, and lists its processes with the cgroups /proc gives
// them: what a failed reading of a group's use needs to explain itself.
func TestDescribe(t *testing.T) {
	m := testManager(t)
	g, err := m.Create("described", Limits{MemoryBytes: 64 << 20, Pids: 16})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	p := start(t, g, "exec sleep 30")
	waitFor(t, "sleep in the group", func() bool {
		ids, _ := g.Pids()
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(p.Process.Pid) + "/comm")
		return len(ids) == 1 && string(comm) == "sleep\n"
	})
	got := g.Describe()
	t.Logf("Describe():\n%s", got)
	want := []string{"cgroup described (v", "process " + strconv.Itoa(p.Process.Pid) + ": Name sleep", "pids.max: 16", "cgroup.procs: [" + strconv.Itoa(p.Process.Pid) + "]"}
	for _, d := range g.uniqueDirs() {
		want = append(want, "  "+d+"\n")
	}
	if m.Version() == 2 {
		want = append(want, "memory.max: 67108864", "memory.current: ", "memory.stat: anon ", "cgroups 0::/"+m.parent+"/described")
	} else {
		want = append(want, "memory.limit_in_bytes: 67108864", "memory.usage_in_bytes: ", "memory.stat: rss ", "memory.oom_control oom_kill: 0",
			":memory:/"+m.parent+"/described")
	}
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("Describe() lacks %q", w)
		}
	}
	if err := g.Remove(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := g.Describe(); !strings.Contains(got, "no such file or directory") {
		t.Errorf("Describe() of a removed group = %q, want the directories reported missing", got)
	}
}
