package native_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestCreateDoesNotForkTheDaemon checks that a create does not clone the
// daemon's own address space. A clone into a new user namespace copies
// the cloning process's memory (it cannot share it until it executes), and
// every page the daemon writes afterwards takes a fault; the more
// sandboxes a daemon holds, the more every create cost. Here the test
// process plays a daemon holding 256 MiB and rewrites all of it after each
// create: had a create cloned it, each rewrite would fault once per page.
func TestCreateDoesNotForkTheDaemon(t *testing.T) {
	b := newBackend(t)
	rootfs := testutil.RootFS(t, "minimal")
	const heap = 256 << 20
	mem := make([]byte, heap)
	touch := func() {
		for i := 0; i < len(mem); i += os.Getpagesize() {
			mem[i]++
		}
	}
	touch()
	const creates = 4
	before := minorFaults(t)
	for range creates {
		create(t, b, isolation.Spec{RootFS: rootfs})
		touch()
	}
	faults := minorFaults(t) - before
	pages := int64(heap / os.Getpagesize())
	t.Logf("%d creates, each followed by a rewrite of %d pages: %d minor faults", creates, pages, faults)
	// A create that cloned this process costs a fault per page at the
	// rewrite after it: creates×pages in all. Without, the creates' own
	// faults are a few thousand.
	if faults >= pages {
		t.Fatalf("%d minor faults over %d creates with a %d-page heap: creates copy the daemon's memory", faults, creates, pages)
	}
}

// TestSpawnerRestarts kills the backend's spawner process: the next create
// starts a new one.
func TestSpawnerRestarts(t *testing.T) {
	b := newBackend(t)
	rootfs := testutil.RootFS(t, "minimal")
	sb := create(t, b, isolation.Spec{RootFS: rootfs})
	killed := 0
	for _, pid := range childrenOf(t, os.Getpid()) {
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if strings.Contains(string(cmdline), "__fence-spawner") {
			if err := unix.Kill(pid, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed++
		}
	}
	if killed == 0 {
		t.Fatal("no spawner process among the test's children")
	}
	sb2 := create(t, b, isolation.Spec{RootFS: rootfs})
	if r := run(t, sb2, "root", "/bin/true"); r.exit != 0 {
		t.Fatalf("exec in a sandbox created after the spawner died: %+v", r)
	}
	// The first sandbox, whose init the dead spawner started, still runs.
	if r := run(t, sb, "root", "/bin/true"); r.exit != 0 {
		t.Fatalf("exec in a sandbox created before the spawner died: %+v", r)
	}
}

// TestSpawnerReapsEachChild kills sandboxes and checks that the spawner
// reaps their inits and keeps a pidfd of each child alive and of no other:
// it waits for each child through its own pidfd (a wait for any child
// scans every child alive), so a pidfd kept after its child's exit would
// be a descriptor leaked per sandbox.
func TestSpawnerReapsEachChild(t *testing.T) {
	b := newBackend(t)
	rootfs := testutil.RootFS(t, "minimal")
	var sbs []isolation.Sandbox
	for range 4 {
		sbs = append(sbs, create(t, b, isolation.Spec{RootFS: rootfs}))
	}
	spawner := b.SpawnerPid()
	if spawner == 0 {
		t.Fatal("no spawner")
	}
	for _, sb := range sbs[:3] {
		if err := sb.Kill(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	var zombies, alive, pidfds int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		zombies, alive = 0, 0
		for _, c := range childrenOf(t, spawner) {
			status, err := os.ReadFile("/proc/" + strconv.Itoa(c) + "/status")
			if err != nil {
				continue
			}
			if strings.HasPrefix(statusFields(t, string(status))["State"], "Z") {
				zombies++
			} else {
				alive++
			}
		}
		pidfds = 0
		fds, err := os.ReadDir("/proc/" + strconv.Itoa(spawner) + "/fd")
		if err != nil {
			t.Fatal(err)
		}
		for _, fd := range fds {
			if target, _ := os.Readlink("/proc/" + strconv.Itoa(spawner) + "/fd/" + fd.Name()); target == "anon_inode:[pidfd]" {
				pidfds++
			}
		}
		if zombies == 0 && pidfds == alive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("spawner after 3 of 4 sandboxes were killed: %d zombie children, %d alive, %d pidfds held", zombies, alive, pidfds)
		}
	}
	// The ready inits started ahead are its children too.
	if alive < 1 {
		t.Fatalf("spawner has %d live children, want at least the sandbox left", alive)
	}
	t.Logf("spawner: %d live children, %d pidfds, no zombie", alive, pidfds)
}

func minorFaults(t *testing.T) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt
}

// childrenOf lists pid's children.
func childrenOf(t *testing.T, pid int) []int {
	var out []int
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + task.Name() + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(raw)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}
