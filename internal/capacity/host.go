package capacity

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// HostOptions say where Host reads.
type HostOptions struct {
	// DataDir is the directory whose file system's space and inodes count.
	DataDir string
	// GroupTasks, if set, reads the tasks in fence's cgroup and its
	// pids.max (ok false when it has none).
	GroupTasks func() (used, max int64, ok bool)
	// Proc is the proc file system; empty means /proc.
	Proc string
	// Now is the clock of the memory reading's reuse (MemoryEvery);
	// nil means time.Now.
	Now func() time.Time
}

// MemoryEvery is how long Host reuses its reading of /proc/meminfo. The
// kernel makes that file's Buffers line by walking every block device
// (nr_blockdev_pages, under a lock), and every sandbox's disk is a loop
// device: with a few thousand of them one reading takes a few hundred
// microseconds, which nearly every create's admission paid at 100 ms. A
// reused reading counts PerSandbox's memory for each check made since
// (each a create or a warm pool's refill that may have taken that much;
// creates in flight are counted apart, Gate.Check's inFlight), so that
// the memory the creates admitted meanwhile took is not missed; what the
// running sandboxes' commands take meanwhile is SafetyMargin's to cover,
// as it is between any reading and the check.
//
// A reading half that old is still used, and a fresh one is made beside
// the check that found it so (off its path): checks that come more often
// than every MemoryEvery/2 never wait for the file, and no check uses a
// reading begun MemoryEvery ago or more.
const MemoryEvery = time.Second

// Host returns a Source reading this host's limits. Each reading is a
// few small reads of /proc and a statfs, none of which grows with the
// sandboxes alive: the daemon's descriptors are the size the kernel
// reports for /proc/self/fd (Linux 6.2 and later; earlier kernels report
// none, and the directory is listed), and the memory reading, which does
// grow with the host's block devices, is made at most once per
// MemoryEvery.
func Host(o HostOptions) Source {
	proc := o.Proc
	if proc == "" {
		proc = "/proc"
	}
	mem := &memReading{proc: proc, now: o.Now}
	if mem.now == nil {
		mem.now = time.Now
	}
	return func() []Reading {
		var out []Reading
		if r, ok := hostTasks(proc); ok {
			out = append(out, r)
		}
		if o.GroupTasks != nil {
			if used, max, ok := o.GroupTasks(); ok {
				out = append(out, Reading{Limit: GroupTasks, Name: "fence's cgroup pids.max", Used: used, Max: max})
			}
		}
		if total, avail, ok := mem.read(); ok {
			out = append(out, Reading{Limit: Memory, Name: "MemTotal", Used: total - avail, Max: total})
		}
		var rl unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil {
			if n, ok := countFDs(proc + "/self/fd"); ok {
				out = append(out, Reading{Limit: DaemonFiles, Name: "the daemon's RLIMIT_NOFILE", Used: n, Max: clamp(rl.Cur)})
			}
		}
		if f := fields(proc + "/sys/fs/file-nr"); len(f) == 3 {
			used, _ := strconv.ParseInt(f[0], 10, 64)
			max, _ := strconv.ParseInt(f[2], 10, 64)
			out = append(out, Reading{Limit: SystemFiles, Name: "fs.file-max", Used: used, Max: max})
		}
		if o.DataDir != "" {
			var st unix.Statfs_t
			if err := unix.Statfs(o.DataDir, &st); err == nil {
				bs := int64(st.Bsize)
				out = append(out, Reading{Limit: Disk, Name: "the data dir's file system", Used: (int64(st.Blocks) - int64(st.Bavail)) * bs, Max: int64(st.Blocks) * bs})
				if st.Files > 0 { // btrfs and others report none
					out = append(out, Reading{Limit: Inodes, Name: "the data dir's file system", Used: int64(st.Files) - int64(st.Ffree), Max: int64(st.Files)})
				}
			}
		}
		return out
	}
}

// hostTasks reads the kernel's scheduling entities (processes and
// threads) from loadavg's "running/total" against the lower of pid_max
// and threads-max.
func hostTasks(proc string) (Reading, bool) {
	f := fields(proc + "/loadavg")
	if len(f) < 4 {
		return Reading{}, false
	}
	_, total, ok := strings.Cut(f[3], "/")
	if !ok {
		return Reading{}, false
	}
	used, err := strconv.ParseInt(total, 10, 64)
	if err != nil {
		return Reading{}, false
	}
	r := Reading{Limit: Tasks, Used: used}
	if n, ok := readInt(proc + "/sys/kernel/pid_max"); ok {
		r.Name, r.Max = "kernel.pid_max", n
	}
	if n, ok := readInt(proc + "/sys/kernel/threads-max"); ok && (r.Max == 0 || n < r.Max) {
		r.Name, r.Max = "kernel.threads-max", n
	}
	return r, r.Max > 0
}

// memReading is Host's reading of /proc/meminfo, reused for MemoryEvery.
type memReading struct {
	proc string
	now  func() time.Time

	mu sync.Mutex
	// +checklocks:mu
	at time.Time // of the last reading; zero before the first
	// +checklocks:mu
	total, avail int64
	// +checklocks:mu
	ok bool
	// +checklocks:mu
	since int64 // checks that reused the reading
	// +checklocks:mu
	refreshing bool // a reading is being made in the background
}

// read returns the memory reading, from /proc/meminfo if the last one is
// MemoryEvery old or more, else the last one less PerSandbox's memory for
// every check that reused it, this one included; from MemoryEvery/2 it
// also starts a fresh reading in the background.
func (m *memReading) read() (total, avail int64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	switch age := now.Sub(m.at); {
	case m.at.IsZero() || age >= MemoryEvery || now.Before(m.at):
		m.total, m.avail, m.ok = meminfo(m.proc)
		m.at, m.since = now, 0
		return m.total, m.avail, m.ok
	case age >= MemoryEvery/2 && !m.refreshing:
		m.refreshing = true
		go m.refresh(now, m.since)
	}
	m.since++
	return m.total, max(m.avail-m.since*PerSandbox[Memory], 0), m.ok
}

// refresh reads /proc/meminfo and keeps the reading as made at at (just
// before it began), unless a newer one was made meanwhile. The checks made
// from the one that started it on (since: the checks counted before it)
// stay counted against the fresh reading, which may not show what they
// admitted.
func (m *memReading) refresh(at time.Time, since int64) {
	total, avail, ok := meminfo(m.proc)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refreshing = false
	if at.After(m.at) {
		m.total, m.avail, m.ok, m.at = total, avail, ok, at
		m.since = max(m.since-since, 0)
	}
}

func meminfo(proc string) (total, avail int64, ok bool) {
	b, err := os.ReadFile(proc + "/meminfo")
	if err != nil {
		return 0, 0, false
	}
	for line := range bytes.Lines(b) {
		f := strings.Fields(string(line))
		if len(f) < 2 {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			total = n << 10
		case "MemAvailable:":
			avail, ok = n<<10, true
		}
	}
	return total, avail, ok && total > 0
}

// countFDs counts the descriptors in dir, a /proc/PID/fd: procfs gives
// their number as its size, where listing it (thousands of entries on a
// node of thousands of sandboxes, at every create's admission) would take
// milliseconds. Elsewhere (an older kernel, a test's directory) it lists.
func countFDs(dir string) (int64, bool) {
	f, err := os.Open(dir)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var fs unix.Statfs_t
	var st unix.Stat_t
	if unix.Fstatfs(int(f.Fd()), &fs) == nil && fs.Type == unix.PROC_SUPER_MAGIC &&
		unix.Fstat(int(f.Fd()), &st) == nil && st.Size > 0 {
		return st.Size, true
	}
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0, false
	}
	return int64(len(names)), true
}

func fields(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

func readInt(path string) (int64, bool) {
	f := fields(path)
	if len(f) != 1 {
		return 0, false
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	return n, err == nil
}

func clamp(u uint64) int64 {
	if u > 1<<62 {
		return 1 << 62
	}
	return int64(u)
}
