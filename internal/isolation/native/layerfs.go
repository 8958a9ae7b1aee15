package native

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/btrfs"
	"github.com/fencesandbox/fence/internal/isolation"
)

// The btrfs layer store: layers, not copies.
//
// With Options.LayerFS (a directory on a btrfs filesystem) each sandbox's
// writable layer (its overlay upper and work dirs) is a btrfs subvolume,
// <LayerFS>/sandboxes/<instance>/<id>/, and a checkpoint is a read-only
// snapshot of it, <LayerFS>/layers/<instance>/<layer>/, taken while the
// sandbox's cgroup is frozen: one ioctl, whose cost does not grow with the
// files the sandbox changed (the kernel flushes what is dirty, which is
// flushed before the freeze to keep the stop short). The sandbox writes on
// in its own subvolume; btrfs copies a block on write, so nothing written
// after the snapshot (in place, through an fd held across it, or through a
// shared mapping) reaches the snapshot. The snapshot's upper/ is the
// layer's tree, stacked read-only under the sandboxes booted on it as a
// copied layer is.
//
// Ids: the subvolume is handed to the sandbox as a detached mount
// idmapped through the sandbox's user namespace, as the template is, so
// the files on disk carry the ids inside the sandbox (0 for its root), not
// the host ids of its uid range. A snapshot is therefore normalised the
// way a copied layer is, and any sandbox mounts it idmapped into its own
// range.
//
// Disk limits are btrfs simple quotas (a qgroup limit per subvolume; every
// block is charged to the subvolume that wrote it for as long as it
// exists, so blocks a sandbox deleted but a checkpoint keeps still count
// against it). Where simple quotas cannot be enabled, the filesystem's
// size is the only bound.
//
// A layer's entry list (paths, kinds, sizes, hashes) is not made at
// checkpoint: it is computed from the snapshot, which never changes, the
// first time a diff needs it, and kept next to meta.json.
//
// Crashes: a sandbox's subvolume is deleted by Cleanup like its other
// leftovers; a snapshot whose layer has no complete meta.json (the layer
// directory is renamed into place after the snapshot exists) is deleted
// by Cleanup, so a half-made checkpoint is never used.
type layerFS struct {
	root    string
	sbDir   string // subvolumes of the sandboxes' writable layers
	snapDir string // read-only snapshots: the layers
	quota   bool   // simple quotas are on: subvolumes are limited
}

// openLayerFS prepares the store under root, which must be on btrfs.
func openLayerFS(root, instance string) (*layerFS, error) {
	if ok, err := btrfs.IsBtrfs(root); err != nil {
		return nil, fmt.Errorf("layer filesystem %s: %w", root, err)
	} else if !ok {
		return nil, fmt.Errorf("layer filesystem %s: %w", root, btrfs.ErrNotBtrfs)
	}
	l := &layerFS{
		root:    root,
		sbDir:   filepath.Join(root, "sandboxes", instance),
		snapDir: filepath.Join(root, "layers", instance),
	}
	for _, d := range []string{root, filepath.Dir(l.sbDir), l.sbDir, filepath.Dir(l.snapDir), l.snapDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("layer filesystem: %w", err)
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, fmt.Errorf("layer filesystem: %w", err)
		}
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("layer filesystem: %w", err)
	}
	defer unix.Close(fd)
	l.quota = btrfs.EnableSimpleQuota(fd) == nil
	return l, nil
}

// newDir makes the subvolume of sandbox id's writable layer, limited to
// limit bytes when quotas are on, and returns its path and an O_PATH
// descriptor of its root.
func (l *layerFS) newDir(id string, limit int64) (string, int, error) {
	parent, err := unix.Open(l.sbDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("creating writable layer: %w", err)
	}
	defer unix.Close(parent)
	if err := btrfs.CreateSubvolume(parent, id); err != nil {
		return "", -1, fmt.Errorf("creating writable layer: %w", err)
	}
	fd, err := unix.Openat(parent, id, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("creating writable layer: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return "", -1, fmt.Errorf("creating writable layer: %w", err)
	}
	if l.quota && limit > 0 {
		if err := btrfs.Limit(fd, limit); err != nil {
			return "", -1, fmt.Errorf("creating writable layer: %w", err)
		}
	}
	pfd, err := unix.Openat(parent, id, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("creating writable layer: %w", err)
	}
	return filepath.Join(l.sbDir, id), pfd, nil
}

// removeDir deletes sandbox id's subvolume, if any.
func (l *layerFS) removeDir(id string) error {
	return btrfs.RemoveAll(filepath.Join(l.sbDir, id))
}

// dirs lists the sandboxes that have a subvolume.
func (l *layerFS) dirs() []string {
	ents, _ := os.ReadDir(l.sbDir)
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// snapshotTree is where layer id's tree is: the snapshot's upper dir.
func (l *layerFS) snapshotTree(id string) string { return filepath.Join(l.snapDir, id, "upper") }

// removeSnapshot deletes layer id's snapshot, if any.
func (l *layerFS) removeSnapshot(id string) error {
	return btrfs.RemoveAll(filepath.Join(l.snapDir, id))
}

// usage returns the bytes charged to the subvolume whose root fd (O_PATH
// will do) is (0 without quotas).
func (l *layerFS) usage(fd int) int64 {
	if !l.quota {
		return 0
	}
	rfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(rfd)
	u, err := btrfs.Usage(rfd)
	if err != nil {
		return 0
	}
	return u
}

// cleanupSnapshots deletes the snapshots no complete layer owns (a crash
// between the snapshot and the rename of its layer's directory, or in
// the middle of a DeleteLayer).
func (b *Backend) cleanupSnapshots() error {
	l := b.lfs
	if l == nil {
		return nil
	}
	ents, err := os.ReadDir(l.snapDir)
	if err != nil {
		return fmt.Errorf("listing layer snapshots: %w", err)
	}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		b.layers.mu.Lock()
		making := b.layers.snapping[name]
		b.layers.mu.Unlock()
		if making {
			continue
		}
		if !strings.HasPrefix(name, layerTmpPrefix) {
			if _, err := os.Stat(filepath.Join(b.layersDir(), name, "meta.json")); err == nil {
				continue
			}
		}
		if err := l.removeSnapshot(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkpointPreflush is the sandbox's dirty page cache above which a btrfs
// checkpoint flushes the layer filesystem before freezing the sandbox.
const checkpointPreflush = 16 << 20

// snapshotCheckpoint is Checkpoint in the btrfs store: a read-only
// snapshot of the sandbox's subvolume taken while it is frozen. The
// layer's Bytes is what the sandbox's subvolume grew by since its previous
// checkpoint (what the new layer pins at most, as far as quotas tell;
// entryCost without them).
func (s *sandbox) snapshotCheckpoint(ctx context.Context) (isolation.LayerInfo, error) {
	b := s.b
	id := isolation.NewID()
	if err := os.MkdirAll(b.layersDir(), 0o700); err != nil {
		return isolation.LayerInfo{}, fmt.Errorf("creating layers directory: %w", err)
	}
	tmp := filepath.Join(b.layersDir(), layerTmpPrefix+id)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return isolation.LayerInfo{}, fmt.Errorf("creating layer: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = b.lfs.removeSnapshot(id)
			os.RemoveAll(tmp)
		}
	}()
	src, err := s.openDisk()
	if err != nil {
		return isolation.LayerInfo{}, err
	}
	defer unix.Close(src)
	dst, err := unix.Open(b.lfs.snapDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return isolation.LayerInfo{}, fmt.Errorf("creating layer: %w", err)
	}
	defer unix.Close(dst)
	// The snapshot flushes the subvolume's dirty data while the sandbox
	// is frozen. When the sandbox has much of it, most is flushed here
	// first, while it runs, so that the freeze lasts about as long as
	// the snapshot's transaction commit (and the usage read next counts
	// it). A sync flushes the whole layer filesystem and commits a
	// transaction of its own: with little dirty, skipping it halves the
	// checkpoint. Where the cgroup does not tell, it syncs.
	dirty := s.cg.DirtyBytes()
	if dirty < 0 || dirty > checkpointPreflush {
		_ = unix.Syncfs(src)
		dirty = 0
	}
	// What the snapshot will flush is not in the usage yet: the budget
	// counts it (at most what the sandbox's dirty page cache holds).
	usage := b.lfs.usage(src)
	s.pmu.Lock()
	grown := max(usage-s.lastUsage+dirty, entryCost)
	s.pmu.Unlock()
	b.layers.mu.Lock()
	used, err := b.layersUsedLocked()
	if err != nil {
		b.layers.mu.Unlock()
		return isolation.LayerInfo{}, err
	}
	if used+grown > b.layerBudget() {
		b.layers.mu.Unlock()
		return isolation.LayerInfo{}, fmt.Errorf("layers take %d bytes, the budget is %d, the new one would take %d: %w", used, b.layerBudget(), grown, isolation.ErrLayerBudget)
	}
	b.layers.making += grown
	if b.layers.snapping == nil {
		b.layers.snapping = map[string]bool{}
	}
	b.layers.snapping[id] = true
	b.layers.mu.Unlock()
	defer func() {
		b.layers.mu.Lock()
		b.layers.making -= grown
		delete(b.layers.snapping, id)
		b.layers.mu.Unlock()
	}()
	took, err := s.frozen(func() error { return btrfs.Snapshot(src, dst, id, true) })
	if err != nil {
		return isolation.LayerInfo{}, fmt.Errorf("checkpointing sandbox %s: %w", s.id, err)
	}
	s.pmu.Lock()
	s.lastUsage = usage + dirty // what was counted, flushed by the snapshot
	s.pmu.Unlock()
	m := &layerMeta{ID: id, Parent: s.base, Depth: len(s.chain) + 1, Bytes: grown, Created: time.Now().UTC(),
		RootFS: s.rootfs, Snapshot: true, Gen: s.gen}
	if err := b.commitLayer(tmp, m); err != nil {
		return isolation.LayerInfo{}, err
	}
	ok = true
	info := m.info()
	info.Took = took
	return info, nil
}

// openDisk opens the root of the sandbox's subvolume.
func (s *sandbox) openDisk() (int, error) {
	s.layerMu.RLock()
	defer s.layerMu.RUnlock()
	if s.layerGone || s.diskFD < 0 {
		return -1, fmt.Errorf("sandbox %s: its layer is released: %w", s.id, isolation.ErrNotFound)
	}
	fd, err := unix.Openat(s.diskFD, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening the writable layer of %s: %w", s.id, err)
	}
	return fd, nil
}
