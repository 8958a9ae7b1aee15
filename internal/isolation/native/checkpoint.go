package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
	"github.com/fencesandbox/fence/internal/isolation"
)

// Layers (isolation.Layers) on the native backend.
//
// A layer is a directory on the host's disk, <StateDir>/layers/<instance>/
// <id>/, holding tree/ (the files, owned by ids relative to the sandbox's
// uid range, as the template's are: any sandbox mounts it idmapped into
// its own range) and meta.json (its parent, size and the list of its
// entries with their hashes). A sandbox booting on a layer stacks it and
// its parents, read-only, between the template and a fresh writable layer:
// nothing is copied, and every sandbox made from the layer shares it.
//
// A checkpoint copies the writable layer of a running sandbox while its
// processes are frozen: the processes keep their writable layer (they
// have it open and mapped), so it cannot be swapped under them, and a
// hard link would let them change the checkpoint by writing a file in
// place. The copy costs what the sandbox changed since it booted, never
// the template; ext4 has no reflink (FICLONE is tried first and used
// where the host's filesystem has it). A sandbox's later checkpoints stack
// on its previous one and copy only what changed since (delta.go), and a
// deep stack is squashed in the background (squash.go).
//
// A layer is made under a temporary name and renamed into place once
// complete: a crash leaves a temporary directory, which Cleanup removes,
// or a complete layer, which the caller's records keep or delete.

const (
	// maxLayerStack is the deepest stack of layers a sandbox boots on
	// (the kernel allows 500 overlay layers; every layer costs a lookup
	// on each miss).
	maxLayerStack = nsinit.MaxLayers
	// defaultLayerBudget is the disk the layers of one backend may take
	// when Options.LayerBudget is zero.
	defaultLayerBudget = 8 << 30
	// maxLayerEntries bounds the entries one layer may hold (and the size
	// of its list in the daemon's memory).
	maxLayerEntries = 200_000
	layerTmpPrefix  = ".tmp-"
)

var (
	_ isolation.Layers       = (*Backend)(nil)
	_ isolation.Checkpointer = (*sandbox)(nil)
)

// CreateOn implements isolation.Layers.
func (b *Backend) CreateOn(ctx context.Context, spec isolation.Spec, layer string) (isolation.Sandbox, error) {
	if layer == "" {
		return b.Create(ctx, spec)
	}
	if !idPattern.MatchString(layer) {
		return nil, fmt.Errorf("invalid layer id %q", layer)
	}
	return b.create(ctx, spec, layer)
}

// Base implements isolation.Checkpointer.
func (s *sandbox) Base() string { return s.base }

// Checkpoint implements isolation.Checkpointer.
func (s *sandbox) Checkpoint(ctx context.Context) (isolation.LayerInfo, error) {
	b := s.b
	if len(s.chain) >= maxLayerStack {
		return isolation.LayerInfo{}, fmt.Errorf("sandbox %s boots on %d layers, the most a checkpoint may stack: %w", s.id, len(s.chain), isolation.ErrLayerBudget)
	}
	if b.lfs != nil {
		return s.snapshotCheckpoint(ctx)
	}
	left, release, err := b.reserveLayerBudget()
	if err != nil {
		return isolation.LayerInfo{}, err
	}
	defer release()

	id := isolation.NewID()
	if err := os.MkdirAll(b.layersDir(), 0o700); err != nil {
		return isolation.LayerInfo{}, fmt.Errorf("creating layers directory: %w", err)
	}
	tmp := filepath.Join(b.layersDir(), layerTmpPrefix+id)
	if err := os.MkdirAll(filepath.Join(tmp, "tree"), 0o755); err != nil {
		return isolation.LayerInfo{}, fmt.Errorf("creating layer: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	dst, err := unix.Open(filepath.Join(tmp, "tree"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return isolation.LayerInfo{}, fmt.Errorf("opening layer: %w", err)
	}
	defer unix.Close(dst)
	c := &layerCopy{ctx: ctx, uidBase: s.slot.hostUID(), left: left, mtimes: map[string]unix.Timespec{},
		next: map[string]prevFile{}, kids: map[string][]string{}, layer: id}
	s.ckptMu.Lock()
	defer s.ckptMu.Unlock()
	var parent string
	var depth int
	var prevLast *lastCheckpoint
	var shared bool
	defer func() {
		if !ok {
			s.loseChanges()
		}
	}()
	took, err := s.frozen(func() (err error) {
		prevLast, shared = s.last, s.squashing != nil // +checklocksignore: fn runs under s.pmu (frozen)
		parent, depth, err = s.copyUpper(c, dst)      // +checklocksignore: fn runs under s.pmu (frozen)
		return err
	})
	if err != nil {
		return isolation.LayerInfo{}, fmt.Errorf("checkpointing sandbox %s: %w", s.id, err)
	}
	// The tree's root is the sandbox root's, as the template's is.
	if err := unix.Fchown(dst, 0, 0); err != nil {
		return isolation.LayerInfo{}, fmt.Errorf("creating layer: %w", err)
	}
	m := &layerMeta{ID: id, Parent: parent, Depth: depth, Bytes: c.bytes, Created: time.Now().UTC(),
		RootFS: s.rootfs, Entries: s.ours(c.entries, c.mtimes)}
	if err := b.commitLayer(tmp, m); err != nil {
		return isolation.LayerInfo{}, err
	}
	s.examined.Store(int64(c.examined))
	s.looked.Store(int64(c.looked))
	next := c.nextCheckpoint(prevLast, id, depth, shared)
	ok = true
	s.pmu.Lock()
	s.last = next
	if depth-len(s.chain) >= squashAfter {
		s.startSquash(s.last)
	}
	s.pmu.Unlock()
	info := m.info()
	info.Took = took
	return info, nil
}

// reserveLayerBudget reserves the layer budget left while a layer is
// made, and returns it with the function that gives it back.
func (b *Backend) reserveLayerBudget() (left int64, release func(), err error) {
	b.layers.mu.Lock()
	defer b.layers.mu.Unlock()
	used, err := b.layersUsedLocked()
	if err != nil {
		return 0, nil, err
	}
	left = b.layerBudget() - used
	if left <= 0 {
		return 0, nil, fmt.Errorf("layers take %d bytes, the budget is %d: %w", used, b.layerBudget(), isolation.ErrLayerBudget)
	}
	b.layers.making += left
	return left, func() {
		b.layers.mu.Lock()
		b.layers.making -= left
		b.layers.mu.Unlock()
	}, nil
}

// copyUpper copies the writable layer into the layer dst with c: what
// changed since the previous checkpoint, on top of it, or the whole of it
// on the boot layer (the first checkpoint, or one at the deepest stack).
// It returns the new layer's parent and depth. The sandbox is frozen.
//
// +checklocks:s.pmu
func (s *sandbox) copyUpper(c *layerCopy, dst int) (parent string, depth int, _ error) {
	b := s.b
	src, err := s.openUpper()
	if err != nil {
		return "", 0, err
	}
	defer unix.Close(src)
	c.stableBefore = time.Now().Add(-stableMargin)
	rec, recorded := s.takeChanges(src)
	last := s.last
	if last != nil && last.depth < maxLayerStack {
		if _, err := b.layerMeta(last.layer); err == nil {
			c.prev, c.prevKids = last.files, last.kids
			root := &pendingDir{src: src, fd: dst, key: ""}
			if recorded && last.dirs != nil && last.inos.one != nil {
				keys, err := s.watchedKeys(c, rec, last, src)
				if err == nil {
					s.watched.Add(1)
					return last.layer, last.depth + 1, c.deltaKeys(root, keys)
				}
				b.log.Warn("reading a sandbox's recorded changes: its checkpoint walks its writable layer", "sandbox_id", s.id, "err", err)
			}
			return last.layer, last.depth + 1, c.delta(root, "", 0)
		}
	}
	prev := -1
	if last != nil {
		// The previous checkpoint's files that did not change since are
		// linked from its layer, not copied: both are frozen.
		if fd, err := unix.Open(b.layerTree(last.layer), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			defer unix.Close(fd)
			prev, c.prev, c.prevLayer = fd, last.files, last.layer
		}
	}
	return s.base, len(s.chain) + 1, c.dir(src, dst, prev, "", 0)
}

// takeChanges returns the changes recorded since the previous checkpoint
// and starts a new record (recorded false: none, walk the layer), starting
// a watcher if the sandbox has none or its record was lost, and its
// writable layer is a filesystem of its own (watch.go). The sandbox is
// frozen.
//
// +checklocks:s.pmu
func (s *sandbox) takeChanges(upper int) (rec map[uint64]map[string]struct{}, recorded bool) {
	if s.watch != nil {
		if rec, ok := s.watch.take(); ok || !s.watch.gone() {
			return rec, ok
		}
		s.watch = nil // closed when its record was lost
	}
	if s.b.disk == nil || s.b.lfs != nil || s.killed || watchOff {
		return nil, false
	}
	w, err := startWatch(upper)
	if err != nil {
		s.b.log.Warn("recording a sandbox's changes: its checkpoints walk its writable layer", "sandbox_id", s.id, "err", err)
		return nil, false
	}
	s.watch = w
	return nil, false
}

// watchOff turns the watcher off (a benchmark's baseline).
var watchOff bool

// loseChanges drops the record of changes (a checkpoint that took it
// failed): the next checkpoint walks the layer.
func (s *sandbox) loseChanges() {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if s.watch != nil {
		s.watch.lose()
	}
}

// stopWatch stops the sandbox's watcher, if it has one.
func (s *sandbox) stopWatch() {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if s.watch != nil {
		s.watch.close()
		s.watch = nil
	}
}

// commitLayer completes the layer made in tmp (a layerTmpPrefix
// directory of b.layersDir()) as m: its meta.json is written and synced,
// then tmp is renamed to the layer's ID, which makes it complete (a crash
// before leaves a partial layer that Cleanup removes), and the layer is
// registered. On an error tmp is left to the caller to remove.
func (b *Backend) commitLayer(tmp string, m *layerMeta) error {
	if err := writeLayerMeta(filepath.Join(tmp, "meta.json"), m); err != nil {
		return err
	}
	if err := syncDir(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(b.layersDir(), m.ID)); err != nil {
		return fmt.Errorf("creating layer: %w", err)
	}
	_ = syncDir(b.layersDir())
	b.layers.mu.Lock()
	b.layers.metas[m.ID] = m
	b.layers.mu.Unlock()
	return nil
}

// frozen runs fn with every process of the sandbox frozen (a paused
// sandbox is frozen already), and reports how long they were stopped.
func (s *sandbox) frozen(fn func() error) (time.Duration, error) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if err := s.liveLocked(); err != nil {
		return 0, err
	}
	if s.paused.Load() {
		return 0, fn()
	}
	start := time.Now()
	if err := s.cg.Freeze(); err != nil {
		_ = s.cg.Thaw()
		return 0, fmt.Errorf("freezing: %w", err)
	}
	err := fn()
	if terr := s.cg.Thaw(); terr != nil {
		return time.Since(start), errors.Join(err, fmt.Errorf("thawing: %w", terr))
	}
	return time.Since(start), err
}

func writeLayerMeta(path string, m *layerMeta) error { return writeJSON(path, m) }

// writeJSON writes v into a new file at path, synced.
func writeJSON(path string, v any) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("writing layer meta: %w", err)
	}
	if err := json.NewEncoder(f).Encode(v); err != nil {
		f.Close()
		return fmt.Errorf("writing layer meta: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("writing layer meta: %w", err)
	}
	return f.Close()
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
