package native_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestStatsCostsNoAllocation holds the cost of a sandbox's resource
// reading, which the daemon takes of every sandbox alive every few
// seconds: its total grows with the sandboxes, and it was a large share
// of the daemon's CPU time (taken from its creates) with 2,000 alive. A
// reading allocates nothing; it used to allocate 26 times (and open five
// control files where three are read now; see cgroup.Group.Usage).
func TestStatsCostsNoAllocation(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{})
	st, err := sb.Stats(t.Context())
	if err != nil {
		t.Fatalf("Stats error: %v", err)
	}
	if st.Pids <= 0 || st.MemoryBytes <= 0 || st.CPUUsage <= 0 {
		t.Errorf("Stats() = %+v, want pids, memory and CPU time above 0", st)
	}
	ctx := context.Background()
	if allocs := testing.AllocsPerRun(50, func() {
		if _, err := sb.Stats(ctx); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("Stats allocated %.1f times per reading, want 0", allocs)
	}
}

// TestStatsOfAnIdleSandbox: a sandbox that ran nothing since its last
// reading is not read again but for its CPU time (its disk's use is not
// read), and once it runs something its memory, tasks and disk are read
// anew: a file written shows.
func TestStatsOfAnIdleSandbox(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{Limits: isolation.Limits{DiskBytes: 256 << 20}})
	var prev isolation.Stats
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := sb.Stats(t.Context())
		if err != nil {
			t.Fatalf("Stats error: %v", err)
		}
		if st.CPUUsage == prev.CPUUsage {
			break // idle since the previous reading
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox's CPU time still moves after 10 s: %v then %v", prev.CPUUsage, st.CPUUsage)
		}
		prev = st
		time.Sleep(50 * time.Millisecond)
	}
	disk := native.DiskReadings()
	st, err := sb.Stats(t.Context())
	if err != nil {
		t.Fatalf("Stats error: %v", err)
	}
	if n := native.DiskReadings() - disk; n != 0 || st != prev {
		t.Errorf("Stats of the idle sandbox = %+v after %+v, %d readings of its disk; want the same, none", st, prev, n)
	}
	if r := run(t, sb, "root", "/bin/sh", "-c", "head -c 8000000 /dev/urandom > /root/f && sync"); r.exit != 0 {
		t.Fatalf("writing a file: %+v", r)
	}
	after, err := sb.Stats(t.Context())
	if err != nil {
		t.Fatalf("Stats error: %v", err)
	}
	if after.CPUUsage <= st.CPUUsage || after.DiskBytes < st.DiskBytes+4<<20 {
		t.Errorf("Stats after writing 8 MB = %+v, before %+v; want more CPU time and at least 4 MiB more disk", after, st)
	}
}

// TestStatsHoldsTheCPUFileUntilKill: a sandbox's readings keep its CPU
// time control file open between them (one pread a reading instead of an
// open, a read and a close), and its kill lets go of it.
func TestStatsHoldsTheCPUFileUntilKill(t *testing.T) {
	b := newBackend(t)
	base := heldCPUFiles(t)
	sb := create(t, b, isolation.Spec{})
	for range 3 {
		if _, err := sb.Stats(t.Context()); err != nil {
			t.Fatalf("Stats error: %v", err)
		}
	}
	if n := heldCPUFiles(t) - base; n != 1 {
		t.Errorf("after 3 readings of a sandbox the daemon holds %d more CPU time files, want 1", n)
	}
	if err := sb.Kill(t.Context()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for heldCPUFiles(t) != base {
		if time.Now().After(deadline) {
			t.Fatalf("the killed sandbox's CPU time file is still open: %d held, %d before it", heldCPUFiles(t), base)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// heldCPUFiles counts this process's descriptors on a cgroup's CPU time
// file.
func heldCPUFiles(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		l, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if strings.HasPrefix(l, "/sys/fs/cgroup/") && (strings.HasSuffix(l, "/cpuacct.usage") || strings.HasSuffix(l, "/cpu.stat")) {
			n++
		}
	}
	return n
}

// TestCreateLooksOnlyAtSandboxesOfItsID: a create checks that no sandbox
// of its ID is alive by looking at the sandboxes of that ID alone, not at
// every one alive (which, under the backend's lock, made each create's
// cost grow with the sandboxes alive), and still refuses a second one.
func TestCreateLooksOnlyAtSandboxesOfItsID(t *testing.T) {
	b := newBackend(t)
	var first isolation.Sandbox
	for i := range 3 {
		sb := create(t, b, isolation.Spec{})
		if i == 0 {
			first = sb
		}
	}
	visits := native.LiveVisits()
	create(t, b, isolation.Spec{})
	if n := native.LiveVisits() - visits; n != 0 {
		t.Errorf("a create beside 3 sandboxes of other IDs looked at %d of them, want 0", n)
	}
	visits = native.LiveVisits()
	_, err := b.Create(t.Context(), isolation.Spec{ID: first.ID(), RootFS: testutil.RootFS(t, "minimal")})
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("a create of the ID of a live sandbox: %v, want it refused (already exists)", err)
	}
	if n := native.LiveVisits() - visits; n != 1 {
		t.Errorf("a create of a live sandbox's ID looked at %d sandboxes, want 1", n)
	}
}
