package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Group is one sandbox's cgroup. Its methods are safe to call from one
// goroutine at a time.
type Group struct {
	m    *Manager
	id   string
	dirs map[string]string // controller ("" on v2) → directory
	fd   int               // v2 directory fd, -1 on v1 or once removed
	// set holds the limits this process gave the group (Create, Reset,
	// SetWeight; a Rename carries them), or nil when they are not known
	// (Open): Reset writes only the control files whose value changes.
	set *Limits
}

// ID returns the group's id.
func (g *Group) ID() string { return g.id }

func (g *Group) v2() bool { return g.m.v2 != "" }

// dir returns the directory for controller c ("" = any), or "".
func (g *Group) dir(c string) string {
	if g.v2() {
		return g.dirs[""]
	}
	if c == "" {
		for _, c := range v1Controllers {
			if d := g.dirs[c]; d != "" {
				return d
			}
		}
	}
	return g.dirs[c]
}

// uniqueDirs returns each directory once, in a stable order.
func (g *Group) uniqueDirs() []string {
	ds := slices.Sorted(maps.Values(g.dirs))
	return slices.Compact(ds)
}

func (g *Group) openFD() error {
	if !g.v2() {
		return nil
	}
	fd, err := unix.Open(g.dirs[""], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", g.dirs[""], err)
	}
	g.fd = fd
	return nil
}

func (g *Group) closeFD() {
	if g.fd >= 0 {
		unix.Close(g.fd)
		g.fd = -1
	}
}

// Close releases the group's directory fd without touching the group.
func (g *Group) Close() error {
	g.closeFD()
	return nil
}

// FD returns a cgroup v2 directory fd for SysProcAttr.UseCgroupFD/CgroupFD
// (clone3 CLONE_INTO_CGROUP), valid until Remove or Close. It reports
// false on v1, where the caller must use AddProc.
func (g *Group) FD() (int, bool) {
	if !g.v2() || g.fd < 0 {
		return -1, false
	}
	return g.fd, true
}

// setLimits writes limits l. prev, when not nil, are the limits the group
// has (g.set): a control file already at its value is not written, nor is
// the memory controller's OOM setting, written with the group. Where l
// sets no memory or CPU limit the group's stays.
func (g *Group) setLimits(l Limits, prev *Limits) error {
	if l.MemoryBytes > 0 && (prev == nil || prev.MemoryBytes != l.MemoryBytes) {
		if err := g.setMemory(l.MemoryBytes, prev != nil && prev.MemoryBytes > 0 && prev.MemoryBytes < l.MemoryBytes); err != nil {
			return err
		}
	}
	if !g.v2() && prev == nil {
		// Keep the OOM killer on so a balloon is killed inside the group
		// instead of hanging it.
		if err := writeFile(g.dir("memory"), "memory.oom_control", "0"); err != nil {
			return err
		}
	}
	if l.CPUs > 0 && (prev == nil || quota(prev.CPUs) != quota(l.CPUs)) {
		if err := g.setQuota(quota(l.CPUs)); err != nil {
			return err
		}
	}
	if l.Pids > 0 && (prev == nil || prev.Pids != l.Pids) {
		if err := writeFile(g.dir("pids"), "pids.max", strconv.FormatInt(l.Pids, 10)); err != nil {
			return err
		}
	}
	if l.Weight > 0 && (prev == nil || weight(prev.Weight) != weight(l.Weight)) {
		return g.SetWeight(l.Weight)
	}
	return nil
}

// setMemory sets the group's memory limit, swap included. raise says the
// group has a lower limit: on v1 the limit with swap is written first then,
// as it may never be below the limit without.
func (g *Group) setMemory(n int64, raise bool) error {
	mem, v := g.dir("memory"), strconv.FormatInt(n, 10)
	if g.v2() {
		if err := writeFile(mem, "memory.max", v); err != nil {
			return err
		}
		// memory.swap.max exists only with swap accounting.
		if err := writeFile(mem, "memory.swap.max", "0"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	memsw := func() error {
		err := writeFile(mem, "memory.memsw.limit_in_bytes", v)
		if errors.Is(err, fs.ErrNotExist) {
			// No swap accounting: keep the group out of swap.
			err = writeFile(mem, "memory.swappiness", "0")
		}
		return err
	}
	if raise {
		if err := memsw(); err != nil {
			return err
		}
	}
	if err := writeFile(mem, "memory.limit_in_bytes", v); err != nil {
		return err
	}
	if raise {
		return nil
	}
	return memsw()
}

// quota is the CFS quota (µs per cfsPeriod) of cpus cores.
func quota(cpus float64) int64 {
	return max(int64(math.Round(cpus*cfsPeriod)), minQuota)
}

// setQuota sets the group's CFS quota q (µs per cfsPeriod).
func (g *Group) setQuota(q int64) error {
	cpu := g.dir("cpu")
	if g.v2() {
		return writeFile(cpu, "cpu.max", fmt.Sprintf("%d %d", q, cfsPeriod))
	}
	// Each write of the period or the quota has the kernel check the
	// bandwidth of every CPU cgroup on the host (a walk that grows with
	// the sandboxes alive), and a group's period is the kernel's default,
	// cfsPeriod, unless it was set otherwise: it is written only then.
	if p, err := readUsage(cpu, "cpu.cfs_period_us", ""); err != nil || p != cfsPeriod {
		if err := writeFile(cpu, "cpu.cfs_period_us", strconv.Itoa(cfsPeriod)); err != nil {
			return err
		}
	}
	return writeFile(cpu, "cpu.cfs_quota_us", strconv.FormatInt(q, 10))
}

// Reset sets the limits of a group made with other limits (one Rename
// gives its final name): l's memory, CPU and task limits where set, no
// task limit where l has none, and l's weight (0: the default). A group
// that was given a memory or CPU limit keeps it where l sets none. Of a
// group whose limits this process set, only the control files whose
// value changes are written.
func (g *Group) Reset(l Limits) error {
	if l.CPUs < 0 || l.MemoryBytes < 0 || l.Pids < 0 {
		return fmt.Errorf("negative cgroup limit %+v", l)
	}
	prev := g.set
	if err := g.setLimits(l, prev); err != nil {
		g.set = nil
		return fmt.Errorf("setting limits of cgroup %s: %w", g.id, err)
	}
	if l.Pids == 0 && (prev == nil || prev.Pids != 0) {
		if err := writeFile(g.dir("pids"), "pids.max", "max"); err != nil {
			g.set = nil
			return fmt.Errorf("setting limits of cgroup %s: %w", g.id, err)
		}
	}
	if l.Weight == 0 && (prev == nil || weight(prev.Weight) != DefaultWeight) {
		if err := g.SetWeight(0); err != nil {
			g.set = nil
			return fmt.Errorf("setting limits of cgroup %s: %w", g.id, err)
		}
	}
	g.set = g.remember(l, prev)
	return nil
}

// remember returns the limits a group has once l is set over prev (nil:
// not known).
func (g *Group) remember(l Limits, prev *Limits) *Limits {
	n := l
	if prev == nil {
		if l.MemoryBytes == 0 || l.CPUs == 0 {
			return nil // whatever the group had stays, unknown
		}
		return &n
	}
	if n.MemoryBytes == 0 {
		n.MemoryBytes = prev.MemoryBytes
	}
	if n.CPUs == 0 {
		n.CPUs = prev.CPUs
	}
	return &n
}

// weight is the weight w stands for (see Limits.Weight), on cpu.shares'
// scale.
func weight(w int) int {
	if w == 0 {
		w = DefaultWeight
	}
	return min(max(w, 2), 262144)
}

// SetWeight sets the group's CPU weight (see Limits.Weight); 0 restores
// the default.
func (g *Group) SetWeight(w int) error {
	w = weight(w)
	var err error
	if g.v2() {
		// cpu.weight's default is 100 where cpu.shares' is 1024.
		err = writeFile(g.dir("cpu"), "cpu.weight", strconv.Itoa(min(max(w*100/DefaultWeight, 1), 10000)))
	} else {
		err = writeFile(g.dir("cpu"), "cpu.shares", strconv.Itoa(w))
	}
	if g.set != nil {
		if err != nil {
			g.set = nil
		} else {
			g.set.Weight = w
		}
	}
	return err
}

// AddProc moves process pid into the group (every hierarchy on v1).
func (g *Group) AddProc(pid int) error {
	// On v1 each hierarchy's migration waits for an RCU grace period;
	// done concurrently, the waits overlap.
	dirs := g.uniqueDirs()
	errs := make([]error, len(dirs))
	var wg sync.WaitGroup
	for i, d := range dirs {
		wg.Go(func() {
			if err := writeFile(d, "cgroup.procs", strconv.Itoa(pid)); err != nil {
				errs[i] = fmt.Errorf("adding pid %d to cgroup %s: %w", pid, g.id, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Pids returns the processes in the group (all hierarchies on v1).
func (g *Group) Pids() ([]int, error) {
	var all []int
	for _, d := range g.uniqueDirs() {
		p, err := readPids(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing cgroup %s: %w", g.id, err)
		}
		all = append(all, p...)
	}
	slices.Sort(all)
	return slices.Compact(all), nil
}

// Freeze stops every task of the group and waits until they are frozen.
func (g *Group) Freeze() error {
	if err := g.setFrozen(true, killTimeout); err != nil {
		return fmt.Errorf("freezing cgroup %s: %w", g.id, err)
	}
	return nil
}

// Thaw resumes a frozen group.
func (g *Group) Thaw() error {
	if err := g.setFrozen(false, killTimeout); err != nil {
		return fmt.Errorf("thawing cgroup %s: %w", g.id, err)
	}
	return nil
}

func (g *Group) setFrozen(frozen bool, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	// A freeze usually completes within a millisecond or two (a pause is
	// timed by it): poll fast first, then back off.
	wait := 100 * time.Microsecond
	if g.v2() {
		d := g.dirs[""]
		v := map[bool]string{true: "1", false: "0"}[frozen]
		// cgroup.events is opened and read before the write: the kernel
		// signals each change of it to poll(2) as POLLPRI against the
		// last read, so the freeze is seen the moment it completes,
		// without sleeping in between.
		ev, err := openEvents(d)
		if err != nil {
			return err
		}
		defer unix.Close(ev)
		if _, err := eventsKey(ev, "frozen"); err != nil {
			return err
		}
		if err := writeFile(d, "cgroup.freeze", v); err != nil {
			return err
		}
		for {
			n, err := eventsKey(ev, "frozen")
			if err != nil {
				return err
			}
			if (n == 1) == frozen {
				return nil
			}
			left := time.Until(deadline)
			if left <= 0 {
				return fmt.Errorf("cgroup.events frozen = %d after %v", n, timeout)
			}
			// The bound on each wait is a safety net only.
			pfd := []unix.PollFd{{Fd: int32(ev), Events: unix.POLLPRI}}
			if _, err := unix.Poll(pfd, int(min(left, pollEvery*10).Milliseconds())+1); err != nil && err != unix.EINTR {
				return fmt.Errorf("waiting on cgroup.events: %w", err)
			}
		}
	}
	d := g.dir("freezer")
	if d == "" {
		return fmt.Errorf("no freezer hierarchy: %w", ErrUnavailable)
	}
	want := map[bool]string{true: "FROZEN", false: "THAWED"}[frozen]
	for {
		// Rewrite each round: v1 may stay FREEZING when a task races.
		if err := writeFile(d, "freezer.state", want); err != nil {
			return err
		}
		f, err := readFields(d, "freezer.state")
		if err != nil {
			return err
		}
		if len(f) == 1 && f[0] == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("freezer.state = %v after %v", f, timeout)
		}
		time.Sleep(wait)
		wait = min(2*wait, pollEvery)
	}
}

// Kill SIGKILLs every task of the group and waits until it is empty.
//
// On v2 it writes cgroup.kill. On v1 it freezes the group, so no member
// can fork or exit while being listed, SIGKILLs every pid in cgroup.procs,
// thaws, and repeats until the group is empty.
func (g *Group) Kill() error {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	return g.kill(ctx)
}

func (g *Group) kill(ctx context.Context) error {
	useKillFile := false
	if g.v2() {
		err := writeFile(g.dirs[""], "cgroup.kill", "1")
		switch {
		case err == nil:
			useKillFile = true
		case errors.Is(err, fs.ErrNotExist): // before Linux 5.14
		default:
			return fmt.Errorf("killing cgroup %s: %w", g.id, err)
		}
	}
	for {
		pids, err := g.Pids()
		if err != nil {
			return fmt.Errorf("killing cgroup %s: %w", g.id, err)
		}
		if len(pids) == 0 {
			return nil
		}
		if !useKillFile {
			if err := g.killRound(); err != nil {
				return fmt.Errorf("killing cgroup %s: %w", g.id, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("killing cgroup %s: %d tasks left (%v): %w", g.id, len(pids), pids, ctx.Err())
		case <-time.After(pollEvery):
		}
	}
}

// killRound is one freeze, kill-all, thaw round.
func (g *Group) killRound() error {
	// Best effort: a group that cannot freeze in time (a task stuck in
	// the kernel) still gets its signals, and the next round retries.
	_ = g.setFrozen(true, time.Second)
	pids, err := g.Pids()
	if err == nil {
		for _, p := range pids {
			if err := unix.Kill(p, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("sending SIGKILL to %d: %w", p, err)
			}
		}
	}
	if terr := g.setFrozen(false, killTimeout); terr != nil && !errors.Is(terr, fs.ErrNotExist) {
		// A group removed meanwhile (by another cleaner) is as dead as
		// it gets.
		return terr
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Stats reads the group's resource use.
func (g *Group) Stats() (Stats, error) {
	var s Stats
	var errs []error
	// get ignores files that do not exist (controller not enabled).
	get := func(v *int64, fn func() (int64, error)) {
		n, err := fn()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		*v = n
	}
	var cpu int64
	if g.v2() {
		d := g.dirs[""]
		get(&cpu, func() (int64, error) { return readKey(d, "cpu.stat", "usage_usec") })
		cpu *= 1000
		get(&s.MemoryBytes, func() (int64, error) { return readInt(d, "memory.current") })
		get(&s.MemoryLimit, func() (int64, error) { return readInt(d, "memory.max") })
		get(&s.Pids, func() (int64, error) { return readInt(d, "pids.current") })
		get(&s.OOMKills, func() (int64, error) { return readKey(d, "memory.events", "oom_kill") })
	} else {
		if d := g.dir("cpuacct"); d != "" {
			get(&cpu, func() (int64, error) { return readInt(d, "cpuacct.usage") })
		}
		if d := g.dir("memory"); d != "" {
			get(&s.MemoryBytes, func() (int64, error) { return readInt(d, "memory.usage_in_bytes") })
			get(&s.MemoryLimit, func() (int64, error) { return readInt(d, "memory.limit_in_bytes") })
			get(&s.OOMKills, func() (int64, error) { return readKey(d, "memory.oom_control", "oom_kill") })
			// v1 reports "no limit" as a page-rounded huge number.
			if s.MemoryLimit >= 1<<62 {
				s.MemoryLimit = 0
			}
		}
		if d := g.dir("pids"); d != "" {
			get(&s.Pids, func() (int64, error) { return readInt(d, "pids.current") })
		}
	}
	s.CPUUsage = time.Duration(cpu)
	if err := errors.Join(errs...); err != nil {
		return s, fmt.Errorf("reading stats of cgroup %s: %w", g.id, err)
	}
	return s, nil
}

// DirtyBytes reports how much of the page cache charged to the group is
// dirty or being written back: what a sync of the files it wrote would
// write now. It reports -1 where the kernel does not tell (no memory
// controller).
func (g *Group) DirtyBytes() int64 {
	d, keys := g.dirs[""], [2]string{"file_dirty", "file_writeback"}
	if !g.v2() {
		d, keys = g.dir("memory"), [2]string{"total_dirty", "total_writeback"}
	}
	if d == "" {
		return -1
	}
	b, err := readFile(d, "memory.stat")
	if err != nil {
		return -1
	}
	var n int64
	for _, k := range keys {
		x, err := keyIn(b, k)
		if err != nil {
			return -1
		}
		n += x
	}
	return n
}

// Remove kills the group's tasks if any, then removes its directories,
// retrying while dying tasks still hold them, until ctx is done. Removing a
// group that is already gone succeeds.
func (g *Group) Remove(ctx context.Context) error {
	g.closeFD()
	pids, err := g.Pids()
	if err != nil {
		return fmt.Errorf("removing cgroup %s: %w", g.id, err)
	}
	if len(pids) > 0 {
		kctx, cancel := context.WithTimeout(ctx, killTimeout)
		err := g.kill(kctx)
		cancel()
		if err != nil {
			return fmt.Errorf("removing cgroup %s: %w", g.id, err)
		}
	}
	for _, d := range g.uniqueDirs() {
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("removing cgroup %s: %w", g.id, &fs.PathError{Op: "rmdir", Path: d, Err: err})
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("removing cgroup %s: %s still busy: %w", g.id, d, ctx.Err())
			case <-time.After(pollEvery):
			}
		}
	}
	return nil
}
