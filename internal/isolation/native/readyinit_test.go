package native_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/cgroup"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/isolation/warm"
	"github.com/fencesandbox/fence/internal/testutil"
)

// waitReadyInits waits until b holds n ready inits.
func waitReadyInits(t *testing.T, b *native.Backend, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for b.ReadyInits() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d ready inits after 30s, want %d", b.ReadyInits(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Sandboxes made from inits started ahead of their create are the same
// sandboxes: the conformance suite runs on a backend that keeps two.
func TestConformanceReadyInits(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	isolationtest.Run(t, func(t *testing.T) isolation.Backend {
		return newBackendWith(t, native.Options{ReadyInits: 2, DiskPool: 2})
	}, rootfs)
}

// A sandbox made from an init started ahead of it, before its writable
// layer was mounted on the host, is its own: its hostname, its own disk of
// its own size (the layer travels as a detached mount), a uid range and a
// cgroup namespace of its own.
func TestReadyInitSandboxesAreTheirOwn(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	b := newBackendWith(t, native.Options{ReadyInits: 2, DiskPool: 2})
	waitReadyInits(t, b, 2)
	var sbs []isolation.Sandbox
	for i := range 4 { // two from the pool, then whatever it holds by then
		limits := isolation.Limits{DiskBytes: int64(64+16*i) << 20}
		sb := create(t, b, isolation.Spec{ID: "ready" + strconv.Itoa(i), RootFS: rootfs, Limits: limits})
		sbs = append(sbs, sb)
		if i == 1 {
			waitReadyInits(t, b, 2) // started after sandbox 0 and 1's disks were mounted
		}
	}
	uids := map[string]bool{}
	for i, sb := range sbs {
		if r := run(t, sb, "root", "hostname"); strings.TrimSpace(r.stdout) != "ready"+strconv.Itoa(i) {
			t.Errorf("sandbox %d: hostname %q", i, r.stdout)
		}
		r := run(t, sb, "root", "sh", "-c", "df -k / | tail -1")
		fields := strings.Fields(r.stdout)
		if len(fields) < 2 {
			t.Fatalf("sandbox %d: df: %q %q", i, r.stdout, r.stderr)
		}
		kb, _ := strconv.Atoi(fields[1])
		want := (64 + 16*i) << 10
		if kb > want || kb < want/2 {
			t.Errorf("sandbox %d: root filesystem of %d KiB, want its own disk of about %d", i, kb, want)
		}
		if r := run(t, sb, "root", "cat", "/proc/self/cgroup"); strings.Contains(r.stdout, "fence") {
			t.Errorf("sandbox %d: /proc/self/cgroup names host cgroups:\n%s", i, r.stdout)
		}
		r = run(t, sb, "root", "cat", "/proc/self/uid_map")
		f := strings.Fields(r.stdout)
		if len(f) != 3 || uids[f[1]] {
			t.Errorf("sandbox %d: uid_map %q: want a range of its own", i, r.stdout)
		}
		uids[f[1]] = true
	}
}

// cpuWeight reads the CPU weight of sandbox id's cgroup under instance.
func cpuWeight(t *testing.T, instance, id string) string {
	t.Helper()
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/cpu/fence", instance, id, "cpu.shares"),
		filepath.Join("/sys/fs/cgroup/fence", instance, id, "cpu.weight"),
	} {
		if b, err := os.ReadFile(p); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("no CPU weight for %s/%s", instance, id)
	return ""
}

// A warm pool's sandbox starts with a low CPU weight (its start yields to
// the sandboxes in use) and is handed out with the ordinary one.
func TestBackgroundSandboxForegroundedAtHandOut(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	b := newBackend(t)
	instance := "test" + strings.ToLower(strings.NewReplacer("/", "", "_", "").Replace(t.Name()))
	low, normal := "64", "1024"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		low, normal = "6", "100"
	}
	sb := create(t, b, isolation.Spec{RootFS: rootfs, Background: true})
	if w := cpuWeight(t, instance, sb.ID()); w != low {
		t.Errorf("background sandbox: CPU weight %s, want %s", w, low)
	}
	if err := sb.(isolation.Foregrounder).Foreground(); err != nil {
		t.Fatal(err)
	}
	if w := cpuWeight(t, instance, sb.ID()); w != normal {
		t.Errorf("foregrounded sandbox: CPU weight %s, want %s", w, normal)
	}
	p := warm.New(warm.Options{Backend: b, Size: 1})
	p.Start(warm.Target{RootFS: rootfs}, nil)
	t.Cleanup(func() { p.Close(context.Background()) })
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	handed, err := p.Create(t.Context(), isolation.Spec{RootFS: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { handed.Kill(context.Background()) })
	if w := cpuWeight(t, instance, handed.ID()); w != normal {
		t.Errorf("sandbox handed out by the warm pool: CPU weight %s, want %s", w, normal)
	}
}

// An init becomes its sandbox's agent without an exec, and the memory its
// runtime took while it waited stays charged to the ready inits' cgroup
// (the kernel moves no charge with a process). That charge grows with the
// sandboxes alive; it must never stop the ready inits from being made, nor
// the sandboxes they became from answering. With a limit on that cgroup
// (64 MiB for one ready init, as there was), the ready inits were
// OOM-killed once about forty sandboxes were alive.
func TestReadyInitsChargeDoesNotLimitSandboxes(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	b := newBackendWith(t, native.Options{ReadyInits: 1})
	const past = 72 << 20
	var sbs []isolation.Sandbox
	for len(sbs) < 120 && b.ReadyMemory() < past {
		waitReadyInits(t, b, 1)
		sb := create(t, b, isolation.Spec{RootFS: rootfs, Limits: isolation.Limits{MemoryBytes: 64 << 20, Pids: 64}})
		sbs = append(sbs, sb)
	}
	t.Logf("%d sandboxes alive, %.1f MiB charged to the ready inits' cgroup", len(sbs), float64(b.ReadyMemory())/(1<<20))
	if b.ReadyMemory() < past {
		t.Fatalf("the ready inits' charge stayed below %d MiB with %d sandboxes: the test does not reach what it tests", past>>20, len(sbs))
	}
	waitReadyInits(t, b, 1)
	for i, sb := range sbs {
		if r := run(t, sb, "root", "/bin/true"); r.exit != 0 {
			t.Fatalf("sandbox %d: %+v", i, r)
		}
	}
}

// Ready inits are born in their own low-weight cgroup, not the daemon's:
// on cgroup v2 they are cloned into it, on v1 the spawner lives in it. A
// sandbox made from one, and one made by a create that found none ready
// (born there too on v1), runs in its own cgroup only.
func TestInitsAreBornInTheReadyCgroup(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	b := newBackendWith(t, native.Options{ReadyInits: 1, DiskPool: 1})
	waitReadyInits(t, b, 1)
	pids, err := b.ReadyGroupPids()
	if err != nil {
		t.Fatal(err)
	}
	inReady := map[int]bool{}
	for _, p := range pids {
		inReady[p] = true
	}
	spawner := b.SpawnerPid()
	if !b.ReadyGroupHasFD() && !inReady[spawner] {
		t.Errorf("cgroup v1: the spawner (pid %d) is not in the ready inits' cgroup (%v)", spawner, pids)
	}
	if b.ReadyGroupHasFD() && inReady[spawner] {
		t.Errorf("cgroup v2: the spawner (pid %d) moved into the ready inits' cgroup", spawner)
	}
	// The first create takes the ready init; the second, right after,
	// finds none ready and starts its own.
	var sbs []isolation.Sandbox
	for i := range 2 {
		sbs = append(sbs, create(t, b, isolation.Spec{ID: "born" + strconv.Itoa(i), RootFS: rootfs}))
	}
	pids, err = b.ReadyGroupPids()
	if err != nil {
		t.Fatal(err)
	}
	for i, sb := range sbs {
		agent := native.AgentPid(sb)
		if slices.Contains(pids, agent) {
			t.Errorf("sandbox %d: its agent (pid %d) is still in the ready inits' cgroup", i, agent)
		}
		cg, err := os.ReadFile("/proc/" + strconv.Itoa(agent) + "/cgroup")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
			if strings.Contains(line, "/fence/") && !strings.HasSuffix(line, "/"+sb.ID()) {
				t.Errorf("sandbox %d: agent in %s, want its own cgroup on every fence hierarchy", i, line)
			}
		}
	}
}

// TestPoolRefillsAfterTheCreate: a create that takes a ready init has the
// pool start its replacement only once it is done, so that the new init's
// start does not compete with the create for the CPU.
func TestPoolRefillsAfterTheCreate(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	b := newBackendWith(t, native.Options{ReadyInits: 1, DiskPool: 1})
	waitReadyInits(t, b, 1)
	inits := func() []int {
		pids, err := b.ReadyGroupPids()
		if err != nil {
			t.Error(err)
		}
		return slices.DeleteFunc(pids, func(p int) bool { return p == b.SpawnerPid() })
	}
	var during []int
	native.SetInitTaken(func() {
		// Long enough for an init started now to show in the ready
		// cgroup; under load it may not, and the test then passes
		// without having seen anything.
		time.Sleep(300 * time.Millisecond)
		during = inits()
	})
	t.Cleanup(func() { native.SetInitTaken(nil) })
	sb := create(t, b, isolation.Spec{ID: "refill", RootFS: rootfs})
	agent := native.AgentPid(sb)
	for _, p := range during {
		if p != agent {
			t.Errorf("init %d started while the create that took init %d ran", p, agent)
		}
	}
	waitReadyInits(t, b, 1)
}

// On cgroup v1 a ready init waits in a cgroup of its own, which the create
// that takes it renames to its sandbox's (no move of the init on the
// create's path) with the sandbox's limits; a crashed daemon's groups of
// that kind are removed when the backend starts.
func TestReadyInitWaitsInItsOwnCgroup(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	instance := "test" + strings.ToLower(strings.NewReplacer("/", "", "_", "").Replace(t.Name()))
	cm, err := cgroup.NewManager("fence/" + instance)
	if err != nil {
		t.Fatal(err)
	}
	if cm.Version() == 2 {
		t.Skip("cgroup v2 clones inits into the ready group: it cannot rename one")
	}
	left, err := cm.Create(native.ReadyGroup+"-4242", cgroup.Limits{Pids: 8})
	if err != nil {
		t.Fatal(err)
	}
	left.Close()
	b := newBackendWith(t, native.Options{ReadyInits: 1, DiskPool: 1})
	if _, err := cm.Open(native.ReadyGroup + "-4242"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a crashed daemon's ready init group: Open error %v after the start, want not exist", err)
	}
	waitReadyInits(t, b, 1)
	pids, err := b.ReadyGroupPids()
	if err != nil {
		t.Fatal(err)
	}
	pids = slices.DeleteFunc(pids, func(p int) bool { return p == b.SpawnerPid() })
	if len(pids) != 1 {
		t.Fatalf("ready inits' pids %v, want one", pids)
	}
	own := cgroupsOf(t, pids[0])
	for _, g := range own {
		if !strings.HasPrefix(path.Base(g), native.ReadyGroup+"-") {
			t.Fatalf("the ready init waits in %s, want a group of its own on every fence hierarchy (%v)", g, own)
		}
	}
	sb := create(t, b, isolation.Spec{ID: "own", RootFS: rootfs, Limits: isolation.Limits{Pids: 77}})
	if agent := native.AgentPid(sb); agent != pids[0] {
		t.Fatalf("the sandbox's agent is %d, want the ready init %d", agent, pids[0])
	}
	for _, g := range cgroupsOf(t, pids[0]) {
		if path.Base(g) != "own" {
			t.Errorf("the agent is in %s, want its sandbox's group on every fence hierarchy", g)
		}
	}
	if _, err := cm.Open(path.Base(own[0])); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the ready init's group %s: Open error %v after its create, want not exist", own[0], err)
	}
	// The sandbox's limits, not the ready init's (64 tasks, weight 2).
	for file, want := range map[string]string{"pids/" + "pids.max": "77", "cpu/" + "cpu.shares": strconv.Itoa(cgroup.DefaultWeight)} {
		hier, name, _ := strings.Cut(file, "/")
		got, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", hier, "fence", instance, "own", name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(got)) != want {
			t.Errorf("the sandbox's %s is %q, want %s", name, strings.TrimSpace(string(got)), want)
		}
	}
	if r := run(t, sb, "root", "/bin/true"); r.exit != 0 {
		t.Fatalf("exec: %+v", r)
	}
}

// cgroupsOf returns the fence cgroups process pid is in, one per hierarchy.
func cgroupsOf(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var gs []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if i := strings.Index(line, "/fence/"); i >= 0 {
			gs = append(gs, line[i:])
		}
	}
	if len(gs) == 0 {
		t.Fatalf("pid %d is in no fence cgroup: %s", pid, b)
	}
	return gs
}

// A backend that keeps no ready inits, such as the one CleanupStale makes
// for a crashed instance, still removes that instance's ready inits'
// groups: the ready group and each init's own.
func TestStartRemovesReadyGroupsWithoutReadyInits(t *testing.T) {
	testutil.RequireRoot(t)
	instance := "test" + strings.ToLower(strings.NewReplacer("/", "", "_", "").Replace(t.Name()))
	cm, err := cgroup.NewManager("fence/" + instance)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{native.ReadyGroup, native.ReadyGroup + "-7"} {
		g, err := cm.Create(id, cgroup.Limits{Pids: 8})
		if err != nil {
			t.Fatal(err)
		}
		g.Close()
	}
	newBackendWith(t, native.Options{})
	for _, id := range []string{native.ReadyGroup, native.ReadyGroup + "-7"} {
		if _, err := cm.Open(id); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a crashed instance's %s: Open error %v after the start, want not exist", id, err)
		}
	}
}

// The init a create takes is replaced once its sandbox is killed (or
// refillDefer has passed), not beside the sandbox's first commands, for a
// take right after another as for the first; the pool is full again once
// the sandboxes are killed.
func TestRefillWhenTheSandboxIsKilled(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	t.Cleanup(native.SetRefillDefer(time.Hour))
	b := newBackendWith(t, native.Options{ReadyInits: 3, DiskPool: 2})
	waitReadyInits(t, b, 3)
	var sbs []isolation.Sandbox
	for _, id := range []string{"first", "second"} {
		sb, err := b.Create(t.Context(), isolation.Spec{ID: id, RootFS: rootfs})
		if err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb)
	}
	for _, sb := range sbs {
		if r := run(t, sb, "root", "/bin/true"); r.exit != 0 {
			t.Fatalf("true exited %d", r.exit)
		}
	}
	pids, err := b.ReadyGroupPids()
	if err != nil {
		t.Fatal(err)
	}
	pids = slices.DeleteFunc(pids, func(p int) bool { return p == b.SpawnerPid() })
	if len(pids) != 1 || b.ReadyInits() != 1 {
		t.Errorf("with both sandboxes alive after their commands: %d inits in the ready cgroups (%v), %d ready; want the one left",
			len(pids), pids, b.ReadyInits())
	}
	for i, sb := range sbs {
		if err := sb.Kill(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitReadyInits(t, b, 2+i)
	}
}

// A create's cgroups are made beside its other steps, as its network is
// attached: the sandbox's state directory is made while the cgroups' step
// has begun and not ended, with a ready init (its group renamed) and
// without (a group made and the init moved). The sandbox then runs in its
// group with its limits: the defaults (which a ready init's group was made
// with) where its spec sets none. A ready init's group has the sandbox's
// CPU weight before that step begins: the init's setup runs at it.
func TestCgroupsMadeBesideTheCreate(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	for _, ready := range []int{1, 0} {
		t.Run("ready"+strconv.Itoa(ready), func(t *testing.T) {
			b := newBackendWith(t, native.Options{ReadyInits: ready, DiskPool: 1,
				Defaults: isolation.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 100}})
			waitReadyInits(t, b, ready)
			seen := make(chan bool, 1)
			shares := make(chan string, 1)
			native.SetCgroupsJoin(func(key string, pid int) {
				shares <- sharesOf(t, pid)
				// The create's steps after the cgroups' start go on
				// meanwhile; were they to wait for this one, the state
				// directory would never come.
				dir := filepath.Join(b.StateDirsDir(), key)
				for range 2000 {
					if _, err := os.Stat(dir); err == nil {
						seen <- true
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
				seen <- false
			})
			t.Cleanup(func() { native.SetCgroupsJoin(nil) })
			sb := create(t, b, isolation.Spec{ID: "beside", RootFS: rootfs, Limits: isolation.Limits{Pids: 77}})
			if !<-seen {
				t.Fatal("the sandbox's state directory was not made while its cgroups' step waited")
			}
			if w := <-shares; ready > 0 && w != "" && w != strconv.Itoa(cgroup.DefaultWeight) {
				t.Errorf("the ready init's group had CPU weight %s as its cgroups' step began, want the sandbox's %d", w, cgroup.DefaultWeight)
			}
			for _, g := range cgroupsOf(t, native.AgentPid(sb)) {
				if path.Base(g) != "beside" {
					t.Errorf("the agent is in %s, want its sandbox's group on every fence hierarchy", g)
				}
			}
			if _, err := os.Stat("/sys/fs/cgroup/pids"); err != nil {
				return // cgroup v2: the files below are v1's
			}
			for file, want := range map[string]string{"pids/pids.max": "77", "cpu/cpu.shares": strconv.Itoa(cgroup.DefaultWeight),
				"cpu/cpu.cfs_quota_us": "100000", "memory/memory.limit_in_bytes": strconv.Itoa(256 << 20)} {
				hier, name, _ := strings.Cut(file, "/")
				got, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", hier, "fence", b.Instance(), "beside", name))
				if err != nil {
					t.Fatal(err)
				}
				if strings.TrimSpace(string(got)) != want {
					t.Errorf("the sandbox's %s is %q, want %s", name, strings.TrimSpace(string(got)), want)
				}
			}
			if r := run(t, sb, "root", "/bin/true"); r.exit != 0 {
				t.Fatalf("exec: %+v", r)
			}
		})
	}
}

// sharesOf returns the cpu.shares of process pid's cgroup on the cpu
// hierarchy (cgroup v1), "" where there is none.
func sharesOf(t *testing.T, pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Error(err)
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "cpu") {
			w, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", f[2], "cpu.shares"))
			if err != nil {
				return ""
			}
			return strings.TrimSpace(string(w))
		}
	}
	return ""
}

// A ready init on cgroup v1 waits in a group that its create renames to
// its sandbox's: it is in its sandbox's cgroups before the go-ahead, and
// enters its cgroup namespace then, while the daemon still makes the
// sandbox's cgroups and network (which the go-ahead waits for), rather
// than after. An init the create moves enters it after the go-ahead.
func TestReadyInitEntersItsCgroupNamespaceBeforeTheGoAhead(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	host, err := os.Readlink("/proc/self/ns/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, ready := range []int{1, 0} {
		t.Run("ready"+strconv.Itoa(ready), func(t *testing.T) {
			b := newBackendWith(t, native.Options{ReadyInits: ready, DiskPool: 1})
			if ready > 0 && b.ReadyGroupHasFD() {
				t.Skip("cgroup v2 moves a ready init at its create")
			}
			waitReadyInits(t, b, ready)
			entered := make(chan bool, 1)
			native.SetCgroupsJoin(func(_ string, pid int) {
				// The go-ahead waits for this step: a namespace the
				// init is in now, it entered before the go-ahead.
				for range 2000 {
					ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/cgroup")
					if err == nil && ns != host {
						entered <- true
						return
					}
					if ready == 0 {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				entered <- false
			})
			t.Cleanup(func() { native.SetCgroupsJoin(nil) })
			sb := create(t, b, isolation.Spec{ID: "cgns", RootFS: rootfs})
			if got, want := <-entered, ready > 0; got != want {
				t.Fatalf("the init in its own cgroup namespace before the go-ahead: %v, want %v", got, want)
			}
			if ns, err := os.Readlink("/proc/" + strconv.Itoa(native.AgentPid(sb)) + "/ns/cgroup"); err != nil || ns == host {
				t.Fatalf("the agent's cgroup namespace %s (%v), want one of its own", ns, err)
			}
			r := run(t, sb, "root", "/bin/cat", "/proc/self/cgroup")
			if r.exit != 0 {
				t.Fatalf("exec: %+v", r)
			}
			for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
				if f := strings.SplitN(line, ":", 3); len(f) == 3 && strings.Contains(f[2], "fence") {
					t.Errorf("the sandbox sees its cgroup as %q, want no host path", line)
				}
			}
		})
	}
}
