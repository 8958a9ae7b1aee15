// Package cgroup puts each sandbox in its own cgroup, with CPU, memory
// (swap included) and pids limits, on cgroup v2 or on cgroup v1 controller
// hierarchies, detected at run time.
//
// A Manager owns one parent group (e.g. "fence/serve"): on v2 under the
// cgroup2 root, on v1 under each controller's hierarchy it uses (memory,
// pids, cpu, cpuacct, freezer). Its children are the per-sandbox Groups.
//
// # Guarantees
//
//   - Create either returns a group with every limit applied, or an error
//     after removing every directory it made for that group.
//   - The OOM killer stays enabled, so a balloon is killed inside its group;
//     swap is limited with memory (memory.swap.max=0 on v2, memsw on v1).
//   - Kill leaves the group with no process, even one that double-forked:
//     cgroup.kill on v2, freeze + SIGKILL every member + thaw on v1.
//   - Remove is idempotent and leaves no directory of the group behind; it
//     waits out dying tasks that linger after SIGKILL.
//   - List and Open need no state in memory, for cleanup after a crash.
//   - Control files are opened with O_CLOEXEC and without following
//     symlinks (openat2 RESOLVE_NO_SYMLINKS, O_NOFOLLOW as a fallback).
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Limits are a group's resource limits. A zero field is unlimited.
type Limits struct {
	CPUs        float64 // CPU bandwidth in cores
	MemoryBytes int64   // memory limit; swap is not allowed beyond it
	Pids        int64   // maximum number of tasks (processes and threads)
	// Weight is the group's share of contended CPU against its siblings,
	// on cgroup v1's cpu.shares scale (2 to 262144; DefaultWeight is the
	// kernel's default); 0 leaves the default.
	Weight int
}

// DefaultWeight is the kernel's default CPU weight (cpu.shares 1024,
// cpu.weight 100 on v2).
const DefaultWeight = 1024

// Stats is a point-in-time reading of a group. Fields whose controller is
// not available read zero.
type Stats struct {
	CPUUsage    time.Duration // cumulative CPU time of the group's tasks
	MemoryBytes int64         // current memory use
	MemoryLimit int64         // 0 when unlimited
	Pids        int64         // current number of tasks
	OOMKills    int64         // tasks killed by the OOM killer in the group
}

// ErrUnavailable is returned when a limit needs a controller the host does
// not offer to the manager's parent group.
var ErrUnavailable = errors.New("cgroup controller not available")

const (
	defaultRoot = "/sys/fs/cgroup"
	cfsPeriod   = 100000 // µs
	minQuota    = 1000   // µs, the kernel's minimum CFS quota
	pollEvery   = 10 * time.Millisecond
	killTimeout = 10 * time.Second
)

// v1Controllers are the v1 hierarchies a group joins; the first four are
// required.
var v1Controllers = []string{"memory", "pids", "cpu", "freezer", "cpuacct"}

// v2Controllers are the controllers a Manager enables for its children on
// v2, when the root offers them.
var v2Controllers = []string{"cpu", "memory", "pids"}

// Manager creates and finds the groups under one parent.
type Manager struct {
	parent string
	v2     string            // cgroup2 root mount point; "" on v1
	v1     map[string]string // controller → hierarchy mount point
	avail  []string          // v2: controllers enabled for children
}

// nameRE matches a cgroup name: 1 to 128 of [A-Za-z0-9_-]. The length is
// checked apart: a bounded repetition compiles into one copy of the class
// per repetition, which costs milliseconds at every start of the binary
// (in every sandbox's init and agent too).
var nameRE = boundedRE{regexp.MustCompile(`^[A-Za-z0-9_-]+$`), 128}

// boundedRE is a pattern with a maximum length.
type boundedRE struct {
	re  *regexp.Regexp
	max int
}

func (b boundedRE) MatchString(s string) bool { return len(s) <= b.max && b.re.MatchString(s) }

func validParent(p string) error {
	for _, seg := range strings.Split(p, "/") {
		if !nameRE.MatchString(seg) {
			return fmt.Errorf("invalid cgroup parent %q", p)
		}
	}
	return nil
}

// NewManager returns a Manager for parent, a relative path such as
// "fence/serve", on the host's cgroup layout: v2 when /sys/fs/cgroup is
// cgroup2, otherwise the v1 controller hierarchies.
func NewManager(parent string) (*Manager, error) {
	if err := validParent(parent); err != nil {
		return nil, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(defaultRoot, &st); err != nil {
		return nil, fmt.Errorf("detecting cgroup layout: %w", err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return newV2(defaultRoot, parent)
	}
	mounts, err := v1Mounts("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	for _, c := range v1Controllers[:4] {
		if mounts[c] == "" {
			return nil, fmt.Errorf("cgroup v1 controller %s is not mounted: %w", c, ErrUnavailable)
		}
	}
	return &Manager{parent: parent, v1: mounts}, nil
}

// newV2 returns a Manager on the cgroup2 hierarchy mounted at root,
// enabling the controllers root offers down to parent.
func newV2(root, parent string) (*Manager, error) {
	if err := validParent(parent); err != nil {
		return nil, err
	}
	m := &Manager{parent: parent, v2: root}
	// Walk root → parent, creating each level and enabling controllers
	// for the next one.
	dir := root
	segs := strings.Split(parent, "/")
	for i := 0; ; i++ {
		offered, err := readFields(dir, "cgroup.controllers")
		if err != nil {
			return nil, err
		}
		want := slices.DeleteFunc(slices.Clone(v2Controllers), func(c string) bool { return !slices.Contains(offered, c) })
		enabled, err := readFields(dir, "cgroup.subtree_control")
		if err != nil {
			return nil, err
		}
		var add []string
		for _, c := range want {
			if !slices.Contains(enabled, c) {
				add = append(add, "+"+c)
			}
		}
		if len(add) > 0 {
			if err := writeFile(dir, "cgroup.subtree_control", strings.Join(add, " ")); err != nil {
				return nil, fmt.Errorf("enabling controllers: %w", err)
			}
		}
		m.avail = want
		if i == len(segs) {
			break
		}
		dir = filepath.Join(dir, segs[i])
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("creating cgroup parent: %w", err)
		}
	}
	return m, nil
}

// v1Mounts maps each v1 controller to the mount point of its hierarchy.
func v1Mounts(mountinfo string) (map[string]string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	defer f.Close()
	mounts := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 || qf[0] != "cgroup" {
			continue
		}
		for _, opt := range strings.Split(qf[2], ",") {
			if slices.Contains(v1Controllers, opt) && mounts[opt] == "" {
				mounts[opt] = pf[4]
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	return mounts, nil
}

// Version returns 1 or 2.
func (m *Manager) Version() int {
	if m.v2 != "" {
		return 2
	}
	return 1
}

// dirs returns the directories of group id, one per hierarchy, keyed by
// controller ("" on v2). Co-mounted controllers share a directory.
func (m *Manager) dirs(id string) map[string]string {
	if m.v2 != "" {
		return map[string]string{"": filepath.Join(m.v2, m.parent, id)}
	}
	d := map[string]string{}
	for _, c := range v1Controllers {
		if mp := m.v1[c]; mp != "" {
			d[c] = filepath.Join(mp, m.parent, id)
		}
	}
	return d
}

// Create makes group id with limits l. It fails if the group exists, and on
// any error removes what it made.
func (m *Manager) Create(id string, l Limits) (_ *Group, err error) {
	if !nameRE.MatchString(id) {
		return nil, fmt.Errorf("invalid cgroup id %q", id)
	}
	if l.CPUs < 0 || l.MemoryBytes < 0 || l.Pids < 0 {
		return nil, fmt.Errorf("negative cgroup limit %+v", l)
	}
	if m.v2 != "" {
		for c, need := range map[string]bool{"cpu": l.CPUs > 0, "memory": l.MemoryBytes > 0, "pids": l.Pids > 0} {
			if need && !slices.Contains(m.avail, c) {
				return nil, fmt.Errorf("creating cgroup %s: %s limit: %w", id, c, ErrUnavailable)
			}
		}
	}
	g := &Group{m: m, id: id, dirs: m.dirs(id), fd: -1}
	var made []string
	defer func() {
		if err != nil {
			g.closeFD()
			for _, d := range slices.Backward(made) {
				_ = unix.Rmdir(d)
			}
		}
	}()
	for _, d := range g.uniqueDirs() {
		if err := os.MkdirAll(filepath.Dir(d), 0o755); err != nil {
			return nil, fmt.Errorf("creating cgroup %s: %w", id, err)
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, fmt.Errorf("creating cgroup %s: %w", id, err)
		}
		made = append(made, d)
	}
	if err := g.setLimits(l, nil); err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", id, err)
	}
	// A new group's limits are the kernel's defaults but for those set.
	set := l
	g.set = &set
	if err := g.openFD(); err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", id, err)
	}
	return g, nil
}

// ErrNoRename is Rename's error on cgroup v2, which cannot rename a group.
var ErrNoRename = errors.New("cgroup v2 cannot rename a group")

// Rename gives group g the id id on every hierarchy and returns it under
// its new id; g is not to be used after. Its tasks stay in it: a rename is
// no migration, so it costs none of the RCU grace periods a move of a task
// into another group waits for on cgroup v1. On failure no hierarchy is
// left renamed. On cgroup v2 it fails with ErrNoRename.
func (m *Manager) Rename(g *Group, id string) (*Group, error) {
	if m.v2 != "" {
		return nil, ErrNoRename
	}
	if !nameRE.MatchString(id) {
		return nil, fmt.Errorf("invalid cgroup id %q", id)
	}
	ng := &Group{m: m, id: id, dirs: map[string]string{}, fd: -1, set: g.set}
	for c, d := range g.dirs {
		ng.dirs[c] = filepath.Join(filepath.Dir(d), id)
	}
	var done []string
	for _, d := range g.uniqueDirs() {
		to := filepath.Join(filepath.Dir(d), id)
		// cgroupfs never replaces: a group of that id already there
		// fails the rename with EEXIST (and it takes no flags).
		if err := unix.Rename(d, to); err != nil {
			for _, from := range slices.Backward(done) {
				_ = unix.Rename(filepath.Join(filepath.Dir(from), id), from)
			}
			return nil, fmt.Errorf("renaming cgroup %s to %s: %w", g.id, id, err)
		}
		done = append(done, d)
	}
	g.closeFD()
	return ng, nil
}

// Open returns the existing group id, e.g. one a crashed daemon left. On
// v1 it covers whichever controller directories exist.
func (m *Manager) Open(id string) (*Group, error) {
	if !nameRE.MatchString(id) {
		return nil, fmt.Errorf("invalid cgroup id %q", id)
	}
	g := &Group{m: m, id: id, dirs: map[string]string{}, fd: -1}
	for c, d := range m.dirs(id) {
		if _, err := os.Lstat(d); err == nil {
			g.dirs[c] = d
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("opening cgroup %s: %w", id, err)
		}
	}
	if len(g.dirs) == 0 {
		return nil, fmt.Errorf("opening cgroup %s: %w", id, fs.ErrNotExist)
	}
	if err := g.openFD(); err != nil {
		return nil, fmt.Errorf("opening cgroup %s: %w", id, err)
	}
	return g, nil
}

// List returns the ids of the groups under the parent, sorted.
func (m *Manager) List() ([]string, error) {
	var ids []string
	seen := map[string]bool{}
	for _, d := range m.dirs("") {
		ents, err := os.ReadDir(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing cgroups: %w", err)
		}
		for _, e := range ents {
			if e.IsDir() && nameRE.MatchString(e.Name()) && !seen[e.Name()] {
				seen[e.Name()] = true
				ids = append(ids, e.Name())
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// RemoveParent removes the Manager's parent group (its last segment only)
// if it holds no groups any more. It is for one-off managers, such as a
// `fence run`'s; a parent in use is left alone and reported.
func (m *Manager) RemoveParent() error {
	var errs []error
	for _, d := range m.dirs("") {
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("removing cgroup parent %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// ParentPids reads the tasks in the parent group (all its groups' tasks)
// and its pids.max, reporting ok false when it has no limit ("max") or
// cannot be read.
func (m *Manager) ParentPids() (current, max int64, ok bool) {
	dir := ""
	if m.v2 != "" {
		dir = filepath.Join(m.v2, m.parent)
	} else if mp := m.v1["pids"]; mp != "" {
		dir = filepath.Join(mp, m.parent)
	} else {
		return 0, 0, false
	}
	read := func(name string) (int64, bool) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0, false
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n, err == nil
	}
	if max, ok = read("pids.max"); !ok {
		return 0, 0, false // "max", or unreadable
	}
	current, ok = read("pids.current")
	return current, max, ok
}
