package cgroup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const helperEnv = "FENCE_CGROUP_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "balloon" {
		balloon()
	}
	os.Exit(m.Run())
}

// balloon waits for a line on stdin, then allocates and touches memory
// until it has 1 GiB, and exits 0 if nothing stopped it.
func balloon() {
	bufio.NewReader(os.Stdin).ReadString('\n')
	var keep [][]byte
	for range 1024 {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		keep = append(keep, b)
	}
	fmt.Println(len(keep))
	os.Exit(0)
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("cgroup tests need root")
		}
		t.Skip("cgroup tests need root")
	}
}

// testManager returns a Manager under a parent unique to the test and
// removes the parent afterwards.
func testManager(t *testing.T) *Manager {
	t.Helper()
	requireRoot(t)
	parent := fmt.Sprintf("fence-test-%d/%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_"))
	m, err := NewManager(parent)
	if err != nil {
		t.Fatalf("NewManager(%q) error: %v", parent, err)
	}
	cleanupManager(t, m)
	return m
}

func cleanupManager(t *testing.T, m *Manager) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		ids, _ := m.List()
		for _, id := range ids {
			if g, err := m.Open(id); err == nil {
				if err := g.Remove(ctx); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
		for _, d := range m.dirs("") {
			unix.Rmdir(d)
			unix.Rmdir(filepath.Dir(d))
		}
	})
}

// proc is a started child process, reaped in the background.
type proc struct {
	*exec.Cmd
	done chan struct{} // closed once reaped; err is then set
	err  error
}

// start runs sh -c script with the shell moved into g before the script
// runs; the script starts after its first line of stdin is consumed.
func start(t *testing.T, g *Group, script string) *proc {
	t.Helper()
	return startCmd(t, g, exec.Command("/bin/sh", "-c", "read x; "+script))
}

func startCmd(t *testing.T, g *Group, cmd *exec.Cmd) *proc {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %v: %v", cmd.Args, err)
	}
	p := &proc{Cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatalf("AddProc(%d) error: %v", cmd.Process.Pid, err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	return p
}

func readTrim(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := readFile(dir, name)
	if err != nil {
		t.Fatalf("reading %s: %v", name, err)
	}
	return strings.TrimSpace(string(b))
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func assertGone(t *testing.T, g *Group) {
	t.Helper()
	for _, d := range g.uniqueDirs() {
		if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Lstat(%s) error = %v, want not exist", d, err)
		}
	}
}

// TestCPUQuotaWritesThePeriodOnlyWhenItDiffers: on cgroup v1 each write
// of a group's CFS period or quota walks every CPU cgroup on the host, so
// a group given a CPU limit has only its quota written while its period
// is the kernel's default; a period set otherwise is still put back.
func TestCPUQuotaWritesThePeriodOnlyWhenItDiffers(t *testing.T) {
	m := testManager(t)
	if m.Version() != 1 {
		t.Skip("cgroup v2 sets the period and the quota in one write (cpu.max)")
	}
	var writes []string
	wrote = func(name string) {
		if strings.HasPrefix(name, "cpu.cfs_") {
			writes = append(writes, name)
		}
	}
	t.Cleanup(func() { wrote = nil })
	g, err := m.Create("quota", Limits{CPUs: 0.5})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	if !slices.Equal(writes, []string{"cpu.cfs_quota_us"}) {
		t.Errorf("Create with a CPU limit wrote %v, want the quota alone", writes)
	}
	if err := writeFile(g.dir("cpu"), "cpu.cfs_period_us", "200000"); err != nil {
		t.Fatal(err)
	}
	writes = nil
	if err := g.Reset(Limits{CPUs: 0.25}); err != nil {
		t.Fatalf("Reset error: %v", err)
	}
	if !slices.Equal(writes, []string{"cpu.cfs_period_us", "cpu.cfs_quota_us"}) {
		t.Errorf("Reset of a group with another period wrote %v, want the period and the quota", writes)
	}
	if p, q := readTrim(t, g.dir("cpu"), "cpu.cfs_period_us"), readTrim(t, g.dir("cpu"), "cpu.cfs_quota_us"); p != "100000" || q != "25000" {
		t.Errorf("period %s, quota %s; want 100000, 25000", p, q)
	}
}

func TestCreateLimits(t *testing.T) {
	m := testManager(t)
	const mem = 64 << 20
	g, err := m.Create("limits", Limits{CPUs: 0.5, MemoryBytes: mem, Pids: 32})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	want := map[string][2]string{} // file → {controller, value}
	if m.Version() == 2 {
		want["memory.max"] = [2]string{"memory", "67108864"}
		want["cpu.max"] = [2]string{"cpu", "50000 100000"}
		want["pids.max"] = [2]string{"pids", "32"}
	} else {
		want["memory.limit_in_bytes"] = [2]string{"memory", "67108864"}
		if _, err := os.Stat(filepath.Join(g.dir("memory"), "memory.memsw.limit_in_bytes")); err == nil {
			want["memory.memsw.limit_in_bytes"] = [2]string{"memory", "67108864"}
		}
		want["cpu.cfs_period_us"] = [2]string{"cpu", "100000"}
		want["cpu.cfs_quota_us"] = [2]string{"cpu", "50000"}
		want["pids.max"] = [2]string{"pids", "32"}
	}
	for file, cv := range want {
		if got := readTrim(t, g.dir(cv[0]), file); got != cv[1] {
			t.Errorf("%s = %q, want %q", file, got, cv[1])
		}
	}
	if m.Version() == 1 {
		if got, err := readKey(g.dir("memory"), "memory.oom_control", "oom_kill_disable"); err != nil || got != 0 {
			t.Errorf("memory.oom_control oom_kill_disable = %d, %v; want 0", got, err)
		}
	}

	cmd := start(t, g, "exec sleep 30")
	pids, err := g.Pids()
	if err != nil || !slices.Contains(pids, cmd.Process.Pid) {
		t.Errorf("Pids() = %v, %v; want it to contain %d", pids, err, cmd.Process.Pid)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatalf("Stats error: %v", err)
	}
	if st.Pids != 1 || st.MemoryLimit != mem {
		t.Errorf("Stats() = %+v, want Pids 1, MemoryLimit %d", st, mem)
	}
	if ids, err := m.List(); err != nil || !slices.Equal(ids, []string{"limits"}) {
		t.Errorf("List() = %v, %v; want [limits]", ids, err)
	}
	if _, err := m.Create("limits", Limits{}); err == nil {
		t.Errorf("Create(existing) error = nil, want error")
	}
	if err := g.Remove(context.Background()); err != nil {
		t.Fatalf("Remove error: %v", err)
	}
	assertGone(t, g)
	if err := g.Remove(context.Background()); err != nil {
		t.Errorf("second Remove error: %v", err)
	}
}

func TestCreateFailsCleanly(t *testing.T) {
	m := testManager(t)
	for _, id := range []string{"", "..", "a/b", "a.b", strings.Repeat("x", 200)} {
		if _, err := m.Create(id, Limits{}); err == nil {
			t.Errorf("Create(%q) error = nil, want error", id)
		}
	}
	if _, err := m.Create("neg", Limits{Pids: -1}); err == nil {
		t.Errorf("Create(Pids -1) error = nil, want error")
	}
	// A CFS quota the kernel rejects fails after the directories exist.
	_, err := m.Create("badcpu", Limits{CPUs: 1e12, Pids: 10})
	if err == nil {
		t.Fatalf("Create(CPUs 1e12) error = nil, want error")
	}
	t.Logf("Create(CPUs 1e12) error: %v", err)
	for _, d := range m.dirs("badcpu") {
		if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after failed Create, Lstat(%s) error = %v, want not exist", d, err)
		}
	}
	if _, err := m.Open("badcpu"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open(badcpu) error = %v, want not exist", err)
	}
}

func TestForkBombHeld(t *testing.T) {
	m := testManager(t)
	const max = 16
	g, err := m.Create("bomb", Limits{Pids: max})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	// 200 background sleeps: forks beyond pids.max fail.
	start(t, g, `i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done; wait`)
	waitFor(t, "pids.events max > 0", func() bool {
		n, err := readKey(g.dir("pids"), "pids.events", "max")
		return err == nil && n > 0
	})
	st, err := g.Stats()
	if err != nil {
		t.Fatalf("Stats error: %v", err)
	}
	if st.Pids > max {
		t.Errorf("Stats().Pids = %d, want <= %d", st.Pids, max)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := g.Remove(ctx); err != nil {
		t.Fatalf("Remove error: %v", err)
	}
	assertGone(t, g)
}

func TestOOMKill(t *testing.T) {
	m := testManager(t)
	g, err := m.Create("oom", Limits{MemoryBytes: 32 << 20})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=balloon")
	p := startCmd(t, g, cmd)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("balloon still running with a 32 MiB limit")
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		t.Fatalf("balloon error = %v, want killed by SIGKILL", p.err)
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("balloon ended with %v, want killed by SIGKILL", ee)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatalf("Stats error: %v", err)
	}
	if st.OOMKills < 1 {
		t.Errorf("Stats().OOMKills = %d, want >= 1", st.OOMKills)
	}
	t.Logf("stats after OOM: %+v", st)
}

func TestKillOrphan(t *testing.T) {
	m := testManager(t)
	g, err := m.Create("orphan", Limits{Pids: 64})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	// The subshell exits at once, so its sleep is reparented away from the
	// shell: a double-forked orphan.
	cmd := start(t, g, `(sleep 60 &); sleep 60`)
	var orphan int
	waitFor(t, "an orphan in the group", func() bool {
		pids, _ := g.Pids()
		for _, p := range pids {
			if ppid(p) > 0 && ppid(p) != cmd.Process.Pid && p != cmd.Process.Pid {
				orphan = p
				return true
			}
		}
		return false
	})
	if err := g.Freeze(); err != nil {
		t.Fatalf("Freeze error: %v", err)
	}
	if err := g.Thaw(); err != nil {
		t.Fatalf("Thaw error: %v", err)
	}
	if err := g.Kill(); err != nil {
		t.Fatalf("Kill error: %v", err)
	}
	if pids, err := g.Pids(); err != nil || len(pids) != 0 {
		t.Errorf("Pids() after Kill = %v, %v; want none", pids, err)
	}
	// Dead: gone, or a zombie until its new parent reaps it.
	if st := procState(orphan); st != "" && st != "Z" {
		t.Errorf("orphan %d state = %q after Kill, want dead", orphan, st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := g.Remove(ctx); err != nil {
		t.Fatalf("Remove error: %v", err)
	}
	assertGone(t, g)
}

func TestFreezeThaw(t *testing.T) {
	m := testManager(t)
	g, err := m.Create("freeze", Limits{})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	start(t, g, "exec sleep 30")
	state := func() string {
		if m.Version() == 2 {
			n, _ := readKey(g.dir(""), "cgroup.events", "frozen")
			return strconv.FormatInt(n, 10)
		}
		return readTrim(t, g.dir("freezer"), "freezer.state")
	}
	frozen, thawed := "FROZEN", "THAWED"
	if m.Version() == 2 {
		frozen, thawed = "1", "0"
	}
	if err := g.Freeze(); err != nil {
		t.Fatalf("Freeze error: %v", err)
	}
	if got := state(); got != frozen {
		t.Errorf("state after Freeze = %q, want %q", got, frozen)
	}
	if err := g.Thaw(); err != nil {
		t.Fatalf("Thaw error: %v", err)
	}
	if got := state(); got != thawed {
		t.Errorf("state after Thaw = %q, want %q", got, thawed)
	}
	// Removing a frozen, populated group works.
	if err := g.Freeze(); err != nil {
		t.Fatalf("Freeze error: %v", err)
	}
	if err := g.Remove(context.Background()); err != nil {
		t.Fatalf("Remove error: %v", err)
	}
	assertGone(t, g)
}

func TestListOpenLeftovers(t *testing.T) {
	m := testManager(t)
	for _, id := range []string{"left1", "left2"} {
		g, err := m.Create(id, Limits{MemoryBytes: 64 << 20, Pids: 8})
		if err != nil {
			t.Fatalf("Create(%s) error: %v", id, err)
		}
		start(t, g, "exec sleep 30")
	}
	// A new manager, as after a daemon crash.
	m2, err := NewManager(m.parent)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := m2.List()
	if err != nil || !slices.Equal(ids, []string{"left1", "left2"}) {
		t.Fatalf("List() = %v, %v; want [left1 left2]", ids, err)
	}
	for _, id := range ids {
		g, err := m2.Open(id)
		if err != nil {
			t.Fatalf("Open(%s) error: %v", id, err)
		}
		if err := g.Remove(context.Background()); err != nil {
			t.Fatalf("Remove(%s) error: %v", id, err)
		}
		assertGone(t, g)
	}
	if ids, err := m2.List(); err != nil || len(ids) != 0 {
		t.Errorf("List() after cleanup = %v, %v; want none", ids, err)
	}
	if _, err := m2.Open("nosuch"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open(nosuch) error = %v, want not exist", err)
	}
}

// TestV2Core runs the v2 code on a cgroup2 hierarchy: /sys/fs/cgroup on a
// pure v2 host, the controller-less "unified" mount on a hybrid one (so
// only the core files: procs, freeze, kill, clone into cgroup).
// TestKillFrozen: a frozen group's tasks die on Kill without being thawed
// first (how a paused sandbox is killed).
func TestKillFrozen(t *testing.T) {
	m := testManager(t)
	g, err := m.Create("frozenkill", Limits{Pids: 64})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	start(t, g, `(sleep 60 &); sleep 60`)
	waitFor(t, "two tasks", func() bool { ps, _ := g.Pids(); return len(ps) >= 2 })
	if err := g.Freeze(); err != nil {
		t.Fatalf("Freeze error: %v", err)
	}
	if err := g.Kill(); err != nil {
		t.Fatalf("Kill of a frozen group error: %v", err)
	}
	if ps, err := g.Pids(); err != nil || len(ps) != 0 {
		t.Errorf("Pids() after Kill = %v, %v; want none", ps, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := g.Remove(ctx); err != nil {
		t.Fatalf("Remove error: %v", err)
	}
	assertGone(t, g)
}

// v2Manager returns a v2 Manager under parent, on the cgroup2 hierarchy
// mounted here (skipping the test when there is none), removed when the
// test ends.
func v2Manager(t *testing.T, parent string) *Manager {
	t.Helper()
	requireRoot(t)
	root := ""
	for _, r := range []string{defaultRoot, defaultRoot + "/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(r, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			root = r
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup2 hierarchy mounted")
	}
	m, err := newV2(root, parent)
	if err != nil {
		t.Fatalf("newV2(%s) error: %v", root, err)
	}
	cleanupManager(t, m)
	return m
}

func TestV2Core(t *testing.T) {
	parent := fmt.Sprintf("fence-test-%d/v2", os.Getpid())
	m := v2Manager(t, parent)
	if !slices.Contains(m.avail, "memory") {
		_, err := m.Create("nomem", Limits{MemoryBytes: 1 << 20})
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("Create(memory limit) without memory controller error = %v, want ErrUnavailable", err)
		}
		if _, err := os.Lstat(m.dirs("nomem")[""]); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("failed Create left %s", m.dirs("nomem")[""])
		}
	}
	g, err := m.Create("core", Limits{})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	fd, ok := g.FD()
	if !ok {
		t.Fatalf("FD() = _, false on v2")
	}
	// Clone straight into the group.
	cmd := exec.Command("/bin/sh", "-c", "(sleep 60 &); exec sleep 60")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting into cgroup: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	wantCg := "0::/" + parent + "/core"
	if got := procCgroup(cmd.Process.Pid); !strings.Contains(got, wantCg) {
		t.Errorf("/proc/%d/cgroup = %q, want %q", cmd.Process.Pid, got, wantCg)
	}
	waitFor(t, "two tasks", func() bool { p, _ := g.Pids(); return len(p) == 2 })
	if err := g.Freeze(); err != nil {
		t.Fatalf("Freeze error: %v", err)
	}
	if err := g.Thaw(); err != nil {
		t.Fatalf("Thaw error: %v", err)
	}
	if _, err := g.Stats(); err != nil {
		t.Errorf("Stats error: %v", err)
	}
	// Kill works on a frozen group (a paused sandbox is killed frozen).
	if err := g.Freeze(); err != nil {
		t.Fatalf("second Freeze error: %v", err)
	}
	if err := g.Kill(); err != nil {
		t.Fatalf("Kill of the frozen group error: %v", err)
	}
	if p, err := g.Pids(); err != nil || len(p) != 0 {
		t.Errorf("Pids() after Kill = %v, %v; want none", p, err)
	}
	if err := g.Thaw(); err != nil {
		t.Fatalf("Thaw after Kill error: %v", err)
	}
	if err := g.Remove(context.Background()); err != nil {
		t.Fatalf("Remove error: %v", err)
	}
	assertGone(t, g)
	if _, ok := g.FD(); ok {
		t.Errorf("FD() after Remove = _, true; want false")
	}
}

// stat returns the fields of /proc/pid/stat after "pid (comm)".
func stat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

func ppid(pid int) int {
	f := stat(pid)
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

func procState(pid int) string {
	if f := stat(pid); len(f) > 0 {
		return f[0]
	}
	return ""
}

func procCgroup(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return string(b)
}

// A renamed group keeps its tasks under its new name on every hierarchy,
// takes the limits Reset gives it, and a rename onto an existing group
// fails and changes nothing. v2 refuses to rename.
func TestRenameKeepsTasks(t *testing.T) {
	m := testManager(t)
	g, err := m.Create("_ready-1", Limits{Pids: 64, Weight: 2})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	if m.Version() == 2 {
		if _, err := m.Rename(g, "sb"); !errors.Is(err, ErrNoRename) {
			t.Fatalf("Rename on v2 error = %v, want ErrNoRename", err)
		}
		return
	}
	cmd := start(t, g, "exec sleep 30")
	other, err := m.Create("taken", Limits{})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	if _, err := m.Rename(g, "taken"); err == nil {
		t.Fatalf("Rename onto an existing group: no error")
	}
	if pids, err := g.Pids(); err != nil || !slices.Equal(pids, []int{cmd.Process.Pid}) {
		t.Fatalf("after a failed Rename, Pids() = %v, %v; want [%d]", pids, err, cmd.Process.Pid)
	}
	if pids, err := other.Pids(); err != nil || len(pids) != 0 {
		t.Fatalf("after a failed Rename, the other group's Pids() = %v, %v; want none", pids, err)
	}
	ng, err := m.Rename(g, "sb")
	if err != nil {
		t.Fatalf("Rename error: %v", err)
	}
	for c, d := range ng.dirs {
		if filepath.Base(d) != "sb" {
			t.Errorf("%s: %s after Rename", c, d)
		}
		if got := readTrim(t, d, "cgroup.procs"); got != strconv.Itoa(cmd.Process.Pid) {
			t.Errorf("%s: cgroup.procs = %q, want %d", c, got, cmd.Process.Pid)
		}
	}
	if _, err := m.Open("_ready-1"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open of the old name error = %v, want not exist", err)
	}
	if err := ng.Reset(Limits{MemoryBytes: 64 << 20}); err != nil {
		t.Fatalf("Reset error: %v", err)
	}
	for file, cv := range map[string][2]string{
		"pids.max":              {"pids", "max"},
		"cpu.shares":            {"cpu", strconv.Itoa(DefaultWeight)},
		"memory.limit_in_bytes": {"memory", "67108864"},
	} {
		if got := readTrim(t, ng.dir(cv[0]), file); got != cv[1] {
			t.Errorf("%s = %q after Reset, want %q", file, got, cv[1])
		}
	}
	if err := ng.Reset(Limits{Pids: 10, Weight: 5}); err != nil {
		t.Fatalf("Reset error: %v", err)
	}
	if got := readTrim(t, ng.dir("pids"), "pids.max"); got != "10" {
		t.Errorf("pids.max = %q after Reset, want 10", got)
	}
	if got := readTrim(t, ng.dir("cpu"), "cpu.shares"); got != "5" {
		t.Errorf("cpu.shares = %q after Reset, want 5", got)
	}
}

// TestResetWritesOnlyWhatChanges: a group made (or reset) by this process
// knows its limits, and Reset writes only the control files whose value
// changes; a ready init's group made with a sandbox's default limits needs
// one write, its weight, at the create. A memory limit raised above the
// group's is written with swap first (v1 refuses a limit above the limit
// with swap).
func TestResetWritesOnlyWhatChanges(t *testing.T) {
	m := testManager(t)
	const mib = 1 << 20
	var writes []string
	wrote = func(name string) { writes = append(writes, name) }
	t.Cleanup(func() { wrote = nil })
	g, err := m.Create("ready", Limits{CPUs: 1, MemoryBytes: 256 * mib, Pids: 512, Weight: 2})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	shares, sharesFile := "cpu.shares", "1024"
	if m.Version() == 2 {
		shares, sharesFile = "cpu.weight", "100"
	}
	writes = nil
	if err := g.Reset(Limits{CPUs: 1, MemoryBytes: 256 * mib, Pids: 512}); err != nil {
		t.Fatalf("Reset error: %v", err)
	}
	if !slices.Equal(writes, []string{shares}) {
		t.Errorf("Reset to the group's limits at the default weight wrote %v, want %s alone", writes, shares)
	}
	if got := readTrim(t, g.dir("cpu"), shares); got != sharesFile {
		t.Errorf("%s = %s, want %s", shares, got, sharesFile)
	}
	g, err = m.Rename(g, "sandbox")
	if err != nil {
		if !errors.Is(err, ErrNoRename) {
			t.Fatal(err)
		}
	}
	writes = nil
	if err := g.Reset(Limits{CPUs: 1, MemoryBytes: 256 * mib, Pids: 512}); err != nil {
		t.Fatalf("Reset error: %v", err)
	}
	if len(writes) != 0 {
		t.Errorf("Reset to the limits the group has wrote %v, want nothing", writes)
	}
	if err := g.Reset(Limits{CPUs: 0.5, MemoryBytes: 512 * mib, Weight: 64}); err != nil {
		t.Fatalf("Reset raising the memory limit: %v", err)
	}
	want := map[string]string{"pids.max": "max"}
	if m.Version() == 2 {
		want["memory.max"] = strconv.Itoa(512 * mib)
		want["cpu.max"] = "50000 100000"
	} else {
		want["memory.limit_in_bytes"] = strconv.Itoa(512 * mib)
		want["cpu.cfs_quota_us"] = "50000"
		want["cpu.shares"] = "64"
		if _, err := os.Stat(filepath.Join(g.dir("memory"), "memory.memsw.limit_in_bytes")); err == nil {
			want["memory.memsw.limit_in_bytes"] = strconv.Itoa(512 * mib)
		}
	}
	for file, v := range want {
		c := strings.Split(file, ".")[0]
		if got := readTrim(t, g.dir(c), file); got != v {
			t.Errorf("%s = %s, want %s", file, got, v)
		}
	}
	if err := g.Reset(Limits{MemoryBytes: 128 * mib}); err != nil {
		t.Fatalf("Reset lowering the memory limit: %v", err)
	}
	if m.Version() == 1 {
		if got := readTrim(t, g.dir("memory"), "memory.limit_in_bytes"); got != strconv.Itoa(128*mib) {
			t.Errorf("memory.limit_in_bytes = %s after lowering, want %d", got, 128*mib)
		}
	}
}
