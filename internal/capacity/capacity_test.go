package capacity

import (
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

func fixed(rs ...Reading) Source { return func() []Reading { return rs } }

func TestLeft(t *testing.T) {
	for _, c := range []struct {
		used, max, cost, margin, want int64
	}{
		{used: 0, max: 100, cost: 10, margin: 0, want: 10},
		{used: 31900, max: 32768, cost: 16, margin: 1024, want: 0}, // over the margin already
		{used: 26788, max: 32768, cost: 16, margin: 1024, want: 309},
		{used: 50, max: 100, cost: 10, margin: 20, want: 3},
		{used: 50, max: 100, cost: 0, margin: 20, want: 30},
		{used: 200, max: 100, cost: 10, margin: 0, want: 0},
	} {
		if got := Left(Reading{Used: c.used, Max: c.max}, c.cost, c.margin); got != c.want {
			t.Errorf("Left(used %d, max %d, cost %d, margin %d) = %d, want %d", c.used, c.max, c.cost, c.margin, got, c.want)
		}
	}
}

// TestCheckCountsInFlight: 3 sandboxes fit; with 2 in flight one more is
// admitted, with 3 it is refused, with a 503 message naming the limit.
func TestCheckCountsInFlight(t *testing.T) {
	g, err := New(Options{Source: fixed(Reading{Limit: Tasks, Name: "kernel.pid_max", Used: 31700, Max: 32768}),
		Cost: Costs{Tasks: 10}, Margin: Costs{Tasks: 1038}})
	if err != nil {
		t.Fatal(err)
	}
	if st := g.Status(); st.Sandboxes != 3 || st.Limit != Tasks {
		t.Errorf("Status = %+v, want 3 sandboxes left on tasks", st)
	}
	for inFlight := range 3 {
		if err := g.Check(inFlight); err != nil {
			t.Errorf("Check(%d) = %v, want admitted", inFlight, err)
		}
	}
	err = g.Check(3)
	var ref *Refusal
	if !errors.As(err, &ref) || !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("Check(3) = %v, want a *Refusal wrapping api.ErrUnavailable", err)
	}
	want := "node at capacity: 31,700 of kernel.pid_max 32,768 tasks in use; raise pid_max (fence serve --tune-kernel) or run fewer sandboxes"
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("message = %q, want it to start with %q", err, want)
	}
	g.Count(err)
	g.Count(errors.New("other"))
	if got := g.Refused(); got[Tasks] != 1 || len(got) != 1 {
		t.Errorf("Refused = %v, want tasks:1", got)
	}
}

// TestPoolLeavesReserve: a pool is refused PoolReserve sandboxes before a
// user, and its refusals are not counted.
func TestPoolLeavesReserve(t *testing.T) {
	g, _ := New(Options{Source: fixed(Reading{Limit: Memory, Name: "MemTotal", Used: 0, Max: 10 << 20}),
		Cost: Costs{Memory: 1 << 20}, Margin: Costs{}})
	if err := g.CheckPool(10 - PoolReserve - 1); err != nil {
		t.Errorf("CheckPool with room for the reserve = %v", err)
	}
	if err := g.CheckPool(10 - PoolReserve); err == nil {
		t.Error("CheckPool took the users' reserve")
	}
	if err := g.Check(10 - PoolReserve); err != nil {
		t.Errorf("Check where the pool is refused = %v, want admitted", err)
	}
}

// TestTightestLimit: the first limit without room refuses, whichever it
// is; an unreadable limit (Max 0) is ignored.
func TestTightestLimit(t *testing.T) {
	g, _ := New(Options{Source: fixed(
		Reading{Limit: Tasks, Name: "kernel.pid_max", Used: 100, Max: 32768},
		Reading{Limit: Inodes, Name: "the data dir's file system"},
		Reading{Limit: Disk, Name: "the data dir's file system", Used: 99<<30 + 1<<20, Max: 100<<30 + 4<<20},
	)})
	err := g.Check(0)
	if err == nil || !strings.Contains(err.Error(), "disk space") || !strings.Contains(err.Error(), "101,377 MiB of the data dir's file system 102,404 MiB disk space") {
		t.Errorf("Check = %v, want a refusal on disk space", err)
	}
	if st := g.Status(); st.Sandboxes != 0 || st.Limit != Disk {
		t.Errorf("Status = %+v, want 0 left on disk", st)
	}
}

// TestHostReadsProc reads a made-up /proc.
func TestHostReadsProc(t *testing.T) {
	proc := t.TempDir()
	write := procWriter(t, proc)
	write("loadavg", "0.50 0.40 0.30 3/26788 12345\n")
	write("sys/kernel/pid_max", "32768\n")
	write("sys/kernel/threads-max", "192735\n")
	write("meminfo", "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n")
	write("sys/fs/file-nr", "1000\t0\t9223372036854775807\n")
	os.MkdirAll(filepath.Join(proc, "self/fd"), 0o755)
	write("self/fd/0", "")
	write("self/fd/1", "")
	src := Host(HostOptions{Proc: proc, DataDir: t.TempDir(),
		GroupTasks: func() (int64, int64, bool) { return 40, 100, true }})
	got := map[Limit]Reading{}
	for _, r := range src() {
		got[r.Limit] = r
	}
	if r := got[Tasks]; r.Used != 26788 || r.Max != 32768 || r.Name != "kernel.pid_max" {
		t.Errorf("tasks = %+v", r)
	}
	if r := got[GroupTasks]; r.Used != 40 || r.Max != 100 {
		t.Errorf("cgroup tasks = %+v", r)
	}
	if r := got[Memory]; r.Used != 4000000<<10 || r.Max != 24000000<<10 {
		t.Errorf("memory = %+v", r)
	}
	if r := got[DaemonFiles]; r.Used != 2 || r.Max <= 0 {
		t.Errorf("daemon files = %+v", r)
	}
	if r := got[SystemFiles]; r.Used != 1000 {
		t.Errorf("system files = %+v", r)
	}
	if r := got[Disk]; r.Max <= 0 {
		t.Errorf("disk = %+v", r)
	}
	write("sys/fs/nr_open", "1048576\n")
	kv := ReadKnobs(proc)
	if len(kv) != 3 || kv[0].Name != "kernel.pid_max" || kv[0].Sandboxes != (32768-1024)/16 ||
		kv[2].Name != "fs.nr_open" || kv[2].Sandboxes != (1048576-SafetyMargin[DaemonFiles])/PerSandbox[DaemonFiles] {
		t.Errorf("ReadKnobs = %+v", kv)
	}
}

func TestTune(t *testing.T) {
	proc := t.TempDir()
	for _, k := range Knobs {
		p := filepath.Join(proc, "sys", k.Path)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("128\n"), 0o644)
	}
	os.WriteFile(filepath.Join(proc, "sys/fs/inotify/max_user_watches"), []byte("2000000\n"), 0o644)
	changed, err := Tune(proc)
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != 2 {
		t.Errorf("changed = %q, want pid_max and max_user_instances only", changed)
	}
	if v, _ := readInt(filepath.Join(proc, "sys/kernel/pid_max")); v != 4194304 {
		t.Errorf("pid_max = %d", v)
	}
	if v, _ := readInt(filepath.Join(proc, "sys/fs/inotify/max_user_watches")); v != 2000000 {
		t.Errorf("max_user_watches lowered to %d", v)
	}
	if v, _ := readInt(filepath.Join(proc, "sys/kernel/threads-max")); v != 128 {
		t.Errorf("threads-max changed to %d", v)
	}
}

// TestRaiseNoFile: the descriptor limit goes up to what is asked (the
// soft limit up to the hard one always; past the hard limit when the
// kernel lets this process, which takes CAP_SYS_RESOURCE), and a limit
// already there is left alone.
func TestRaiseNoFile(t *testing.T) {
	var before unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &before); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &before) })
	low := unix.Rlimit{Cur: before.Max - 100, Max: before.Max}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	changed, err := RaiseNoFile(before.Max)
	var after unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &after)
	if err != nil || after.Cur != before.Max || changed == "" {
		t.Errorf("RaiseNoFile(%d) from a soft limit of %d: %+v, changed %q, %v", before.Max, low.Cur, after, changed, err)
	}
	if changed, err := RaiseNoFile(before.Max - 10); err != nil || changed != "" {
		t.Errorf("RaiseNoFile below the limit = %q, %v; want nothing changed", changed, err)
	}
	want := before.Max + 1000
	switch changed, err := RaiseNoFile(want); {
	case errors.Is(err, unix.EPERM):
		t.Logf("this process may not raise its hard limit: %v", err)
	case err != nil:
		t.Errorf("RaiseNoFile(%d): %v", want, err)
	default:
		unix.Getrlimit(unix.RLIMIT_NOFILE, &after)
		if after.Cur != want || after.Max != want || changed == "" {
			t.Errorf("after RaiseNoFile(%d): %+v, changed %q", want, after, changed)
		}
	}
}

// TestDaemonFilesReadingDoesNotList: the daemon's descriptors are counted
// without listing /proc/self/fd, whose entries (thousands on a node of
// thousands of sandboxes) a create's admission would otherwise read one by
// one; the count is still right.
func TestDaemonFilesReadingDoesNotList(t *testing.T) {
	if !kernelAtLeast(t, 6, 2) {
		t.Skip("the kernel reports no size for /proc/self/fd before Linux 6.2")
	}
	n0, ok := countFDs("/proc/self/fd")
	if !ok {
		t.Fatal("countFDs failed")
	}
	const extra = 2000
	for range extra {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
	}
	n1, _ := countFDs("/proc/self/fd")
	if n1-n0 != extra {
		t.Errorf("countFDs went from %d to %d with %d more open, want %d more", n0, n1, extra, extra)
	}
	// A listing allocates at least a name per descriptor.
	if allocs := testing.AllocsPerRun(10, func() { countFDs("/proc/self/fd") }); allocs > 100 {
		t.Errorf("counting %d descriptors allocates %.0f times: it lists them", n1, allocs)
	}
}

// kernelAtLeast reports whether the running kernel is at least major.minor.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var ma, mi int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi)
	return ma > major || (ma == major && mi >= minor)
}

// TestHostReusesItsMemoryReading: /proc/meminfo, which the kernel makes by
// walking every block device, is read at most once per MemoryEvery, each
// check meanwhile counting one more sandbox's memory used; the other
// readings are made each time.
func TestHostReusesItsMemoryReading(t *testing.T) {
	proc := t.TempDir()
	write := procWriter(t, proc)
	write("sys/kernel/pid_max", "32768\n")
	write("loadavg", "0.50 0.40 0.30 3/100 12345\n")
	write("meminfo", "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n")
	now := time.Unix(1000, 0)
	src := Host(HostOptions{Proc: proc, Now: func() time.Time { return now }})
	read := func() (mem, tasks Reading) {
		for _, r := range src() {
			switch r.Limit {
			case Memory:
				mem = r
			case Tasks:
				tasks = r
			}
		}
		return mem, tasks
	}
	if m, _ := read(); m.Used != 4000000<<10 {
		t.Fatalf("memory = %+v", m)
	}
	write("meminfo", "MemTotal:       24000000 kB\nMemAvailable:   10000000 kB\n")
	write("loadavg", "0.50 0.40 0.30 3/200 12345\n")
	now = now.Add(MemoryEvery / 4) // before a fresh reading is started beside
	if m, tk := read(); m.Used != 4000000<<10+PerSandbox[Memory] || tk.Used != 200 {
		t.Errorf("within MemoryEvery: memory %+v (want the reading before and one sandbox's), tasks %+v (want 200)", m, tk)
	}
	if m, _ := read(); m.Used != 4000000<<10+2*PerSandbox[Memory] {
		t.Errorf("within MemoryEvery, a second check: memory %+v, want the reading before and two sandboxes'", m)
	}
	now = now.Add(MemoryEvery * 3 / 4)
	if m, _ := read(); m.Used != 14000000<<10 {
		t.Errorf("MemoryEvery later: memory %+v, want the new reading", m)
	}
}

// TestHostRefreshesItsMemoryReadingAhead: a reading MemoryEvery/2 old is
// used, and a fresh one is made in the background, which the next
// reading within MemoryEvery of the first returns without reading.
func TestHostRefreshesItsMemoryReadingAhead(t *testing.T) {
	proc := t.TempDir()
	write := procWriter(t, proc)
	write("meminfo", "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n")
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	src := Host(HostOptions{Proc: proc, Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	mem := func() int64 {
		for _, r := range src() {
			if r.Limit == Memory {
				return r.Used
			}
		}
		return -1
	}
	if m := mem(); m != 4000000<<10 {
		t.Fatalf("memory used = %d", m)
	}
	write("meminfo", "MemTotal:       24000000 kB\nMemAvailable:   10000000 kB\n")
	advance(MemoryEvery / 2)
	if m := mem(); m != 4000000<<10+PerSandbox[Memory] {
		t.Errorf("MemoryEvery/2 later: memory used %d, want the reading before and one sandbox's (a fresh one is made beside)", m)
	}
	advance(MemoryEvery / 4) // still within MemoryEvery of the first reading
	deadline := time.Now().Add(5 * time.Second)
	for {
		m := mem()
		if extra := m - 14000000<<10; extra >= 0 {
			// The check that started the fresh reading stays counted, and
			// so does this one.
			if extra < 2*PerSandbox[Memory] || extra%PerSandbox[Memory] != 0 {
				t.Fatalf("the fresh reading: memory used %d, want %d and two sandboxes' or more", m, int64(14000000<<10))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the reading made in the background never came: within MemoryEvery of the first, reads return the first")
		}
		time.Sleep(time.Millisecond)
	}
}

// procWriter returns a function that writes a file of a made-up /proc at
// proc, making its directories.
func procWriter(t *testing.T, proc string) func(name, s string) {
	return func(name, s string) {
		t.Helper()
		p := filepath.Join(proc, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
