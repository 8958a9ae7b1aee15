package native

import (
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Forget drops a sandbox from the backend's memory without killing it, as
// a daemon crash would.
func (b *Backend) Forget(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.live[id]; ok {
		b.dropLive(s)
	}
}

// HoldReleases makes every background release of a killed sandbox wait
// until the returned function is called, and sets how many releases may be
// pending; call it before any Kill.
func (b *Backend) HoldReleases(maxPending int) (releaseAll func()) {
	gate := make(chan struct{})
	b.pending.setMax(maxPending)
	b.reapHook = func(string) { <-gate }
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }
}

// PendingReleases returns how many killed sandboxes wait for their release.
func (b *Backend) PendingReleases() int { return b.pending.len() }

// LayersDir is where the backend keeps its layers.
func (b *Backend) LayersDir() string { return b.layersDir() }

// SnapshotDir is where the btrfs store keeps its snapshots ("" for the
// copy store).
func (b *Backend) SnapshotDir() string {
	if b.lfs == nil {
		return ""
	}
	return b.lfs.snapDir
}

// LayerTree is where layer id's files are.
func (b *Backend) LayerTree(id string) string { return b.layerTree(id) }

// Instance is the backend's instance name.
func (b *Backend) Instance() string { return b.opts.Instance }

// ReadyInits returns how many inits wait in the backend's ready pool.
func (b *Backend) ReadyInits() int { return len(b.ready) }

// AgentPid is the host pid of sb's agent (its PID 1).
func AgentPid(sb any) int { return sb.(*sandbox).proc.Pid }

// ReadyGroupPids returns the processes in the ready inits' cgroup and in
// the ready inits' own (cgroup v1, ownGroup).
func (b *Backend) ReadyGroupPids() ([]int, error) {
	pids, err := b.readyCg.Pids()
	if err != nil {
		return nil, err
	}
	ids, err := b.cg.List()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if !strings.HasPrefix(id, readyGroup+"-") {
			continue
		}
		g, err := b.cg.Open(id)
		if err != nil {
			continue // taken meanwhile
		}
		p, _ := g.Pids()
		g.Close()
		pids = append(pids, p...)
	}
	return pids, nil
}

// ReadyGroup is the name of the ready inits' cgroup.
const ReadyGroup = readyGroup

// SpawnerPid is the pid of the running spawner (0 if none runs).
func (b *Backend) SpawnerPid() int {
	b.spawner.mu.Lock()
	defer b.spawner.mu.Unlock()
	if b.spawner.conn == nil {
		return 0
	}
	return b.spawner.proc.Process.Pid
}

// ReadyGroupHasFD reports whether inits are cloned into the ready cgroup
// directly (cgroup v2).
func (b *Backend) ReadyGroupHasFD() bool { _, ok := b.readyCg.FD(); return ok }

// SetInitTaken sets the hook a create calls once it has taken its init.
func SetInitTaken(f func()) { initTaken = f }

// SetCgroupsJoin sets the hook a create calls as its cgroups' step begins.
func SetCgroupsJoin(f func(key string, pid int)) { cgroupsJoin = f }

// StateDirsDir is where the backend makes its sandboxes' state
// directories.
func (b *Backend) StateDirsDir() string { return b.sbDir }

// StateDirOf returns the backend's state directory.
func StateDirOf(b *Backend) string { return b.opts.StateDir }

// CutLifeline closes the daemon's end of a sandbox's lifeline, as the
// daemon's death would.
func CutLifeline(sb interface{ ID() string }) {
	s := sb.(*sandbox)
	s.lifeline.Close()
}

// NoSquash keeps the backend's checkpoints from being squashed until the
// test ends.
func NoSquash(t interface{ Cleanup(func()) }) {
	old := squashAfter
	squashAfter = 1 << 30
	t.Cleanup(func() { squashAfter = old })
}

// MaxLayerStack is the deepest stack of layers a sandbox boots on.
const MaxLayerStack = maxLayerStack

// SandboxDir is a sandbox's state directory on the host.
func SandboxDir(sb any) string {
	s := sb.(*sandbox)
	return filepath.Join(s.b.sbDir, s.key)
}

// ScratchDir is the directory every init mounts its tmpfs on.
func (b *Backend) ScratchDir() string { return b.scratchDir() }

// WatchedCheckpoints counts sb's checkpoints made from the record of its
// changes instead of a walk of its writable layer.
func WatchedCheckpoints(sb any) int64 { return sb.(*sandbox).watched.Load() }

// LookedKeys is how many keys of the index by inode sb's last checkpoint
// looked at to place the files its processes hold and the other names of
// changed files.
func LookedKeys(sb any) int64 { return sb.(*sandbox).looked.Load() }

// InodeIndexOK reports whether sb's index by inode holds every regular
// file of its checkpoint's index under its inode, and nothing else.
func InodeIndexOK(sb any) error {
	s := sb.(*sandbox)
	s.pmu.Lock()
	last := s.last
	s.pmu.Unlock()
	flat := func(x inodeIndex) map[string]uint64 {
		m := map[string]uint64{}
		for ino, k := range x.one {
			m[k] = ino
		}
		for ino, ks := range x.many {
			for k := range ks {
				m[k] = ino
			}
		}
		return m
	}
	got, want := flat(last.inos), flat(inodesOf(last.files))
	for k, ino := range want {
		if g, ok := got[k]; !ok || g != ino {
			return fmt.Errorf("index by inode: %s (inode %d) missing", k, ino)
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("index by inode: %d keys, want %d", len(got), len(want))
	}
	return nil
}

// WatchState returns how many events sb's watcher has read and whether
// it still holds its fanotify group (false with no watcher).
func WatchState(sb any) (events int64, open bool) {
	s := sb.(*sandbox)
	s.pmu.Lock()
	w := s.watch
	s.pmu.Unlock()
	if w == nil {
		return 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.events, !w.closed
}

// HeldInodes is heldInodes: the inodes pids hold open for writing or
// map shared.
var HeldInodes = heldInodes

// FDTablesRead counts the tables of descriptors HeldInodes read.
func FDTablesRead() int64 { return fdTablesRead.Load() }

// ExaminedEntries is how many entries of sb's writable layer its last
// checkpoint read.
func ExaminedEntries(sb any) int64 { return sb.(*sandbox).examined.Load() }

// KeepLastCheckpoint returns a function that makes sb's next checkpoint
// stack again on the checkpoint it stacks on now, by a walk of its
// writable layer.
func KeepLastCheckpoint(sb any) (restore func()) {
	s := sb.(*sandbox)
	s.pmu.Lock()
	last := *s.last // a copy: the next checkpoint updates the index in place
	last.files, last.kids, last.dirs, last.inos = maps.Clone(last.files), maps.Clone(last.kids), maps.Clone(last.dirs), last.inos.clone()
	s.pmu.Unlock()
	return func() {
		s.pmu.Lock()
		s.last = &last
		if s.watch != nil {
			s.watch.lose()
		}
		s.pmu.Unlock()
	}
}

// NoWatch keeps the backend's sandboxes from recording their changes
// (their checkpoints walk) until the test ends or AllowWatch.
func NoWatch(t interface{ Cleanup(func()) }) {
	watchOff = true
	t.Cleanup(AllowWatch)
}

// AllowWatch undoes NoWatch.
func AllowWatch() { watchOff = false }

// SetRefillDefer sets how long the refill of a take may wait for the
// sandbox that took the init, and returns the function that restores it.
func SetRefillDefer(d time.Duration) (restore func()) {
	old := refillDefer
	refillDefer = d
	return func() { refillDefer = old }
}

// DiskReadings counts the readings of writable layers' use by Stats.
func DiskReadings() int64 { return diskReadings.Load() }

// LiveVisits counts the live sandboxes creates looked at to find one of
// the same ID.
func LiveVisits() int64 { return liveVisits.Load() }
