package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native/nsinit"
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
// where the host's filesystem has it).
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

// layerMeta is a layer's meta.json.
type layerMeta struct {
	ID      string                 `json:"id"`
	Parent  string                 `json:"parent,omitempty"`
	Depth   int                    `json:"depth"`
	Bytes   int64                  `json:"bytes"`
	Created time.Time              `json:"created"`
	RootFS  string                 `json:"rootfs"` // the template it sits on
	Entries []isolation.FileChange `json:"entries"`
	// Snapshot marks a layer of the btrfs store (layerfs.go): its tree is
	// a read-only snapshot, and its entries are listed when first needed
	// (entries.json), with Gen (the files fence wrote at create, by path,
	// with their mtime then) left out as Checkpointer.Changes does.
	Snapshot bool                     `json:"snapshot,omitempty"`
	Gen      map[string]unix.Timespec `json:"gen,omitempty"`

	// listMu serialises the listing of a snapshot's entries; listed is
	// set (under the backend's layers.mu, with Entries) once done.
	listMu sync.Mutex
	listed bool
}

func (m *layerMeta) info() isolation.LayerInfo {
	return isolation.LayerInfo{ID: m.ID, Parent: m.Parent, Depth: m.Depth, Bytes: m.Bytes, Files: len(m.Entries), Created: m.Created}
}

// layerCache holds the metas of the backend's layers, read once.
type layerCache struct {
	mu sync.Mutex
	// +checklocks:mu
	loaded bool
	// +checklocks:mu
	metas map[string]*layerMeta
	// +checklocks:mu
	making int64 // bytes reserved by layers being made
	// snapping holds the layers whose snapshot exists before their
	// meta.json (the btrfs store): Cleanup leaves them alone.
	// +checklocks:mu
	snapping map[string]bool
}

func (b *Backend) layersDir() string {
	return filepath.Join(b.opts.StateDir, "layers", b.opts.Instance)
}

// layerTree is where layer id's files are: its tree/, or its snapshot's
// upper dir in the btrfs store.
func (b *Backend) layerTree(id string) string {
	if b.lfs != nil {
		if m, err := b.layerMeta(id); err == nil && m.Snapshot {
			return b.lfs.snapshotTree(id)
		}
	}
	return filepath.Join(b.layersDir(), id, "tree")
}

// layerEntries returns layer id's entries, listing a snapshot's the first
// time (the snapshot never changes, so neither does the list).
func (b *Backend) layerEntries(ctx context.Context, id string) ([]isolation.FileChange, error) {
	m, err := b.layerMeta(id)
	if err != nil {
		return nil, err
	}
	if !m.Snapshot {
		return m.Entries, nil
	}
	m.listMu.Lock()
	defer m.listMu.Unlock()
	b.layers.mu.Lock()
	listed, es := m.listed, m.Entries
	b.layers.mu.Unlock()
	if listed {
		return es, nil
	}
	path := filepath.Join(b.layersDir(), id, "entries.json")
	if f, err := os.Open(path); err == nil {
		err = json.NewDecoder(io.LimitReader(f, 256<<20)).Decode(&es)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("reading the entries of layer %s: %w", id, err)
		}
	} else {
		if b.lfs == nil {
			return nil, fmt.Errorf("layer %s is a btrfs snapshot and this backend has no layer filesystem: %w", id, isolation.ErrNotFound)
		}
		fd, err := unix.Open(b.lfs.snapshotTree(id), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("listing layer %s: %w", id, err)
		}
		defer unix.Close(fd)
		c := &layerCopy{ctx: ctx, left: 1 << 62, mtimes: map[string]unix.Timespec{}}
		if err := c.dir(fd, -1, -1, "", 0); err != nil {
			return nil, fmt.Errorf("listing layer %s: %w", id, err)
		}
		es = withoutGen(c.entries, m.Gen, c.mtimes)
		tmp := filepath.Join(b.layersDir(), id, layerTmpPrefix+"entries.json")
		os.Remove(tmp)
		if err := writeJSON(tmp, es); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp, path); err != nil {
			return nil, fmt.Errorf("writing the entries of layer %s: %w", id, err)
		}
	}
	b.layers.mu.Lock()
	m.Entries, m.listed = es, true
	b.layers.mu.Unlock()
	return es, nil
}

func (b *Backend) layerBudget() int64 {
	if b.opts.LayerBudget > 0 {
		return b.opts.LayerBudget
	}
	return defaultLayerBudget
}

// layersUsedLocked is how many bytes the layers take: every complete
// layer's (their metas loaded first), and what the layers being made
// reserved.
//
// +checklocks:b.layers.mu
func (b *Backend) layersUsedLocked() (int64, error) {
	if err := b.loadLayersLocked(); err != nil {
		return 0, err
	}
	used := b.layers.making
	for _, m := range b.layers.metas {
		used += m.Bytes
	}
	return used, nil
}

// loadLayersLocked reads every complete layer's meta once.
//
// +checklocks:b.layers.mu
func (b *Backend) loadLayersLocked() error {
	if b.layers.loaded {
		return nil
	}
	metas := map[string]*layerMeta{}
	ents, err := os.ReadDir(b.layersDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("listing layers: %w", err)
	}
	for _, e := range ents {
		if !idPattern.MatchString(e.Name()) {
			continue
		}
		m, err := readLayerMeta(filepath.Join(b.layersDir(), e.Name(), "meta.json"))
		if err != nil || m.ID != e.Name() {
			b.log.Warn("ignoring a layer without a readable meta.json", "layer", e.Name(), "err", err)
			continue
		}
		metas[m.ID] = m
	}
	b.layers.metas, b.layers.loaded = metas, true
	return nil
}

func readLayerMeta(path string) (*layerMeta, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var m layerMeta
	if err := json.NewDecoder(io.LimitReader(f, 256<<20)).Decode(&m); err != nil {
		return nil, err
	}
	return &m, nil
}

func (b *Backend) layerMeta(id string) (*layerMeta, error) {
	b.layers.mu.Lock()
	defer b.layers.mu.Unlock()
	if err := b.loadLayersLocked(); err != nil {
		return nil, err
	}
	m, ok := b.layers.metas[id]
	if !ok {
		return nil, fmt.Errorf("layer %s: %w", id, isolation.ErrNotFound)
	}
	return m, nil
}

// layerChain returns layer and its parents, top first.
func (b *Backend) layerChain(id string) ([]string, error) {
	var chain []string
	for id != "" {
		if len(chain) >= maxLayerStack {
			return nil, fmt.Errorf("layer %s sits on more than %d layers: %w", chain[0], maxLayerStack, isolation.ErrLayerBudget)
		}
		m, err := b.layerMeta(id)
		if err != nil {
			return nil, err
		}
		chain = append(chain, id)
		id = m.Parent
	}
	return chain, nil
}

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

// ListLayers implements isolation.Layers.
func (b *Backend) ListLayers(ctx context.Context) ([]isolation.LayerInfo, error) {
	b.layers.mu.Lock()
	defer b.layers.mu.Unlock()
	if err := b.loadLayersLocked(); err != nil {
		return nil, err
	}
	out := make([]isolation.LayerInfo, 0, len(b.layers.metas))
	for _, m := range b.layers.metas {
		out = append(out, m.info())
	}
	slices.SortFunc(out, func(a, c isolation.LayerInfo) int { return a.Created.Compare(c.Created) })
	return out, nil
}

// DeleteLayer implements isolation.Layers.
func (b *Backend) DeleteLayer(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("invalid layer id %q", id)
	}
	// A sandbox's overlay looks names up in its layers as it goes: the
	// files of a layer under a live sandbox must stay.
	b.mu.Lock()
	for sid, sb := range b.live {
		if slices.Contains(sb.chain, id) {
			b.mu.Unlock()
			return fmt.Errorf("layer %s is used by sandbox %s: %w", id, sid, isolation.ErrLayerInUse)
		}
	}
	b.mu.Unlock()
	b.layers.mu.Lock()
	if err := b.loadLayersLocked(); err != nil {
		b.layers.mu.Unlock()
		return err
	}
	delete(b.layers.metas, id)
	b.layers.mu.Unlock()
	// Renamed away first: a half-removed layer never looks complete (and
	// a snapshot without its layer is Cleanup's to delete).
	dir := filepath.Join(b.layersDir(), id)
	trash := filepath.Join(b.layersDir(), layerTmpPrefix+"del-"+id)
	if err := os.Rename(dir, trash); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing layer %s: %w", id, err)
	}
	if b.lfs != nil {
		if err := b.lfs.removeSnapshot(id); err != nil {
			return fmt.Errorf("removing layer %s: %w", id, err)
		}
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("removing layer %s: %w", id, err)
	}
	return nil
}

// cleanupLayers removes what a crash left of layers being made or deleted.
func (b *Backend) cleanupLayers() error {
	ents, err := os.ReadDir(b.layersDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing layers: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), layerTmpPrefix) {
			errs = append(errs, os.RemoveAll(filepath.Join(b.layersDir(), e.Name())))
		}
	}
	return errors.Join(errs...)
}

// LayerChanges implements isolation.Layers.
func (b *Backend) LayerChanges(ctx context.Context, layer string) ([]isolation.FileChange, error) {
	chain, err := b.layerChain(layer)
	if err != nil {
		return nil, err
	}
	m, err := b.layerMeta(layer)
	if err != nil {
		return nil, err
	}
	return b.mergedChanges(ctx, chain, nil, m.RootFS)
}

// mergedChanges merges the entries of chain (top first) and then top, as
// the overlay shows them, against the template at rootfs.
func (b *Backend) mergedChanges(ctx context.Context, chain []string, top []isolation.FileChange, rootfs string) ([]isolation.FileChange, error) {
	merged := map[string]isolation.FileChange{}
	apply := func(es []isolation.FileChange) {
		for _, e := range es {
			if e.Kind == "removed" || e.Opaque {
				for p := range merged {
					if strings.HasPrefix(p, e.Path+"/") {
						delete(merged, p)
					}
				}
			}
			merged[e.Path] = e
		}
	}
	for i := len(chain) - 1; i >= 0; i-- {
		es, err := b.layerEntries(ctx, chain[i])
		if err != nil {
			return nil, err
		}
		apply(es)
	}
	apply(top)
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil, fmt.Errorf("opening template: %w", err)
	}
	defer root.Close()
	out := make([]isolation.FileChange, 0, len(merged))
	for _, e := range merged {
		st, err := root.Lstat(strings.TrimPrefix(e.Path, "/"))
		inTemplate := err == nil
		switch {
		case e.Kind == "removed" && !inTemplate:
			continue // made and deleted again: nothing changed
		case e.Kind == "dir" && inTemplate && st.IsDir() && !e.Opaque && uint32(st.Mode().Perm()) == e.Mode&0o777:
			continue // only there because something below it changed
		}
		e.InTemplate = inTemplate
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, c isolation.FileChange) int { return strings.Compare(a.Path, c.Path) })
	return out, nil
}

// stamps returns the mtime and the ctime of each of paths (files in the
// layer upper), by their path in the layer.
func stamps(paths []string, upper string) (mtimes, ctimes map[string]unix.Timespec) {
	mtimes, ctimes = map[string]unix.Timespec{}, map[string]unix.Timespec{}
	for _, p := range paths {
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil {
			mtimes[strings.TrimPrefix(p, upper)] = st.Mtim
			ctimes[strings.TrimPrefix(p, upper)] = st.Ctim
		}
	}
	return mtimes, ctimes
}

// ours drops the entries of files fence wrote at create and the sandbox
// left as they were: they are not the sandbox's changes.
func (s *sandbox) ours(es []isolation.FileChange, mtimes map[string]unix.Timespec) []isolation.FileChange {
	return withoutGen(es, s.gen, mtimes)
}

func withoutGen(es []isolation.FileChange, gen, mtimes map[string]unix.Timespec) []isolation.FileChange {
	out := es[:0]
	for _, e := range es {
		if t, ok := gen[e.Path]; ok && mtimes[e.Path] == t {
			continue
		}
		out = append(out, e)
	}
	return out
}

// Base implements isolation.Checkpointer.
func (s *sandbox) Base() string { return s.base }

// Changes implements isolation.Checkpointer.
func (s *sandbox) Changes(ctx context.Context) ([]isolation.FileChange, error) {
	fd, err := s.openUpper()
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	c := &layerCopy{ctx: ctx, uidBase: s.slot.hostUID(), left: 1 << 62, mtimes: map[string]unix.Timespec{}}
	if err := c.dir(fd, -1, -1, "", 0); err != nil {
		return nil, err
	}
	return s.b.mergedChanges(ctx, s.chain, s.ours(c.entries, c.mtimes), s.rootfs)
}

// Checkpoint implements isolation.Checkpointer.
func (s *sandbox) Checkpoint(ctx context.Context) (isolation.LayerInfo, error) {
	b := s.b
	if len(s.chain) >= maxLayerStack {
		return isolation.LayerInfo{}, fmt.Errorf("sandbox %s boots on %d layers, the most a checkpoint may stack: %w", s.id, len(s.chain), isolation.ErrLayerBudget)
	}
	if b.lfs != nil {
		return s.snapshotCheckpoint(ctx)
	}
	// The budget left, reserved while this layer is made.
	b.layers.mu.Lock()
	used, err := b.layersUsedLocked()
	if err != nil {
		b.layers.mu.Unlock()
		return isolation.LayerInfo{}, err
	}
	left := b.layerBudget() - used
	if left <= 0 {
		b.layers.mu.Unlock()
		return isolation.LayerInfo{}, fmt.Errorf("layers take %d bytes, the budget is %d: %w", used, b.layerBudget(), isolation.ErrLayerBudget)
	}
	b.layers.making += left
	b.layers.mu.Unlock()
	defer func() {
		b.layers.mu.Lock()
		b.layers.making -= left
		b.layers.mu.Unlock()
	}()

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
	c := &layerCopy{ctx: ctx, uidBase: s.slot.hostUID(), left: left, mtimes: map[string]unix.Timespec{}, next: map[string]prevFile{}}
	took, err := s.frozen(func() error {
		src, err := s.openUpper()
		if err != nil {
			return err
		}
		defer unix.Close(src)
		prev := -1
		if s.last != nil { // +checklocksignore: fn runs under s.pmu (frozen)
			// The previous checkpoint's files that did not change since
			// are linked from its layer, not copied: both are frozen.
			if fd, err := unix.Open(b.layerTree(s.last.layer), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil { // +checklocksignore: fn runs under s.pmu (frozen)
				defer unix.Close(fd)
				prev, c.prev = fd, s.last.files // +checklocksignore: fn runs under s.pmu (frozen)
			}
		}
		c.stableBefore = time.Now().Add(-stableMargin)
		return c.dir(src, dst, prev, "", 0)
	})
	if err != nil {
		return isolation.LayerInfo{}, fmt.Errorf("checkpointing sandbox %s: %w", s.id, err)
	}
	// The tree's root is the sandbox root's, as the template's is.
	if err := unix.Fchown(dst, 0, 0); err != nil {
		return isolation.LayerInfo{}, fmt.Errorf("creating layer: %w", err)
	}
	m := &layerMeta{ID: id, Parent: s.base, Depth: len(s.chain) + 1, Bytes: c.bytes, Created: time.Now().UTC(),
		RootFS: s.rootfs, Entries: s.ours(c.entries, c.mtimes)}
	if err := b.commitLayer(tmp, m); err != nil {
		return isolation.LayerInfo{}, err
	}
	ok = true
	s.pmu.Lock()
	s.last = &lastCheckpoint{layer: id, files: c.next}
	s.pmu.Unlock()
	info := m.info()
	info.Took = took
	return info, nil
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

// layerCopy copies (or, with no destination, only lists) a writable
// layer through descriptors: every name is one path element opened
// relative to its directory without following symlinks, on both sides.
type layerCopy struct {
	ctx     context.Context
	uidBase uint32
	left    int64 // bytes the copy may still take
	bytes   int64
	entries []isolation.FileChange
	mtimes  map[string]unix.Timespec // of the entries, by path
	buf     []byte
	// prev indexes the previous checkpoint's files (nil: none), next this
	// one's; stableBefore is the ctime before which a file is indexed.
	prev, next   map[string]prevFile
	stableBefore time.Time
}

// prevFile is what identifies a file of the writable layer as unchanged
// since a checkpoint copied it: the same inode with the same change time
// and size (a write, truncate, chmod, chown, rename or utimes sets the
// change time; the sandbox cannot set it back).
type prevFile struct {
	ino   uint64
	ctime unix.Timespec
	size  int64
	sha   string
}

// lastCheckpoint is a sandbox's previous checkpoint: its layer and index.
type lastCheckpoint struct {
	layer string
	files map[string]prevFile
}

// stableMargin keeps out of the index the files whose change time is so
// close to the checkpoint that a write right after it could get the same
// (coarse) timestamp.
const stableMargin = 50 * time.Millisecond

// remember indexes a copied (or linked) file for the next checkpoint.
func (c *layerCopy) remember(path string, st *unix.Stat_t, sum string) {
	if c.next == nil || !time.Unix(st.Ctim.Unix()).Before(c.stableBefore) {
		return
	}
	c.next[path] = prevFile{ino: st.Ino, ctime: st.Ctim, size: st.Size, sha: sum}
}

// entryCost is what an entry is charged on top of its data.
const entryCost = 512

func (c *layerCopy) charge(n int64) error {
	if n > c.left {
		return fmt.Errorf("the layer would exceed the space left for layers: %w", isolation.ErrLayerBudget)
	}
	c.left -= n
	c.bytes += n
	return nil
}

// id maps a host id of the sandbox's range to its id inside (what the
// layer stores); anything else becomes nobody.
func (c *layerCopy) id(host uint32) int {
	if host >= c.uidBase && host < c.uidBase+uidRange {
		return int(host - c.uidBase)
	}
	return nobodyID
}

func (c *layerCopy) add(e isolation.FileChange) error {
	if len(c.entries) >= maxLayerEntries {
		return fmt.Errorf("more than %d changed paths: %w", maxLayerEntries, isolation.ErrLayerBudget)
	}
	c.entries = append(c.entries, e)
	return nil
}

// dir copies the entries of directory src (the layer's path rel) into
// directory dst (-1: list only).
func (c *layerCopy) dir(src, dst, prev int, rel string, depth int) error {
	if depth > maxLayerDepth {
		return fmt.Errorf("/%s: nested deeper than %d directories", rel, maxLayerDepth)
	}
	return walkDir(c.ctx, src, rel, func(name string) error {
		return c.entry(src, dst, prev, rel, name, depth)
	})
}

func (c *layerCopy) entry(src, dst, prev int, rel, name string, depth int) error {
	p := rel + name
	var st unix.Stat_t
	if err := unix.Fstatat(src, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("reading layer entry /%s: %w", p, err)
	}
	if err := c.charge(entryCost); err != nil {
		return err
	}
	e := isolation.FileChange{Path: "/" + p, Mode: st.Mode & 0o7777}
	if c.mtimes != nil {
		c.mtimes[e.Path] = st.Mtim
	}
	uid, gid := c.id(st.Uid), c.id(st.Gid)
	mtime := []unix.Timespec{st.Atim, st.Mtim}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return nil // device nodes are never kept
		}
		e.Kind, e.Mode = "removed", 0
		if dst >= 0 {
			if err := unix.Mknodat(dst, name, unix.S_IFCHR, 0); err != nil {
				return fmt.Errorf("copying whiteout /%s: %w", p, err)
			}
		}
		return c.add(e)
	case unix.S_IFDIR:
		e.Kind = "dir"
		sfd, opaque, err := openLayerDir(src, name, p)
		if err != nil || sfd < 0 {
			return err
		}
		defer unix.Close(sfd)
		e.Opaque = opaque
		dfd := -1
		if dst >= 0 {
			if err := unix.Mkdirat(dst, name, 0o700); err != nil {
				return fmt.Errorf("copying directory /%s: %w", p, err)
			}
			if dfd, err = unix.Openat(dst, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
				return fmt.Errorf("copying directory /%s: %w", p, err)
			}
			defer unix.Close(dfd)
			if err := copyXattrs(sfd, dfd); err != nil {
				return fmt.Errorf("copying directory /%s: %w", p, err)
			}
		}
		if err := c.add(e); err != nil {
			return err
		}
		sub := -1
		if prev >= 0 {
			if fd, err := unix.Openat(prev, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
				defer unix.Close(fd)
				sub = fd
			}
		}
		if err := c.dir(sfd, dfd, sub, p+"/", depth+1); err != nil {
			return err
		}
		if dfd >= 0 {
			if err := finish(dfd, uid, gid, st.Mode&0o7777, mtime); err != nil {
				return fmt.Errorf("copying directory /%s: %w", p, err)
			}
		}
		return nil
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(src, name, buf)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("reading layer symlink /%s: %w", p, err)
		}
		e.Kind, e.Target, e.Size = "symlink", string(buf[:n]), int64(n)
		if dst >= 0 {
			if err := unix.Symlinkat(e.Target, dst, name); err != nil {
				return fmt.Errorf("copying symlink /%s: %w", p, err)
			}
			if err := unix.Fchownat(dst, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("copying symlink /%s: %w", p, err)
			}
			_ = unix.UtimesNanoAt(dst, name, mtime, unix.AT_SYMLINK_NOFOLLOW)
		}
		return c.add(e)
	case unix.S_IFIFO:
		e.Kind = "other"
		if dst >= 0 {
			if err := unix.Mkfifoat(dst, name, 0o600); err != nil {
				return fmt.Errorf("copying fifo /%s: %w", p, err)
			}
			if err := unix.Fchownat(dst, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("copying fifo /%s: %w", p, err)
			}
			if err := unix.Fchmodat(dst, name, st.Mode&0o7777, 0); err != nil {
				return fmt.Errorf("copying fifo /%s: %w", p, err)
			}
		}
		return c.add(e)
	case unix.S_IFREG:
		e.Kind = "file"
		sum, size, err := c.file(src, dst, prev, name, p, uid, gid, mtime)
		if err != nil {
			return err
		}
		if size < 0 {
			return nil // gone meanwhile
		}
		e.SHA256, e.Size = sum, size
		return c.add(e)
	default:
		return nil // sockets: nothing to keep
	}
}

// file copies (or only hashes) one regular file and returns its hash and
// size; size -1 when it is gone or no longer a regular file.
func (c *layerCopy) file(src, dst, prev int, name, p string, uid, gid int, times []unix.Timespec) (string, int64, error) {
	sfd, err := unix.Openat(src, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
			return "", -1, nil
		}
		return "", 0, fmt.Errorf("opening layer file /%s: %w", p, err)
	}
	sf := os.NewFile(uintptr(sfd), name)
	defer sf.Close()
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "", -1, err
	}
	key := "/" + p
	if dst >= 0 && prev >= 0 {
		if pf, ok := c.prev[key]; ok && pf.ino == st.Ino && pf.ctime == st.Ctim && pf.size == st.Size {
			if unix.Linkat(prev, name, dst, name, 0) == nil {
				c.remember(key, &st, pf.sha)
				return pf.sha, st.Size, nil
			}
		}
	}
	r := c.reader(sfd, sf, &st)
	if err := c.charge(st.Blocks * 512); err != nil {
		return "", 0, err
	}
	if dst < 0 {
		sum, _, err := r.sum(nil)
		if err != nil {
			return "", 0, fmt.Errorf("reading layer file /%s: %w", p, err)
		}
		return sum, st.Size, nil
	}
	dfd, err := unix.Openat(dst, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return "", 0, fmt.Errorf("copying file /%s: %w", p, err)
	}
	df := os.NewFile(uintptr(dfd), name)
	defer df.Close()
	if err := copyXattrs(sfd, dfd); err != nil {
		return "", 0, fmt.Errorf("copying file /%s: %w", p, err)
	}
	// A clone shares the blocks where the filesystem can (holes stay
	// holes); the hash still reads the data once. Else the data extents
	// are copied at their offsets and the holes stay holes.
	var out io.WriterAt
	if unix.IoctlFileClone(dfd, sfd) != nil {
		if err := df.Truncate(st.Size); err != nil {
			return "", 0, fmt.Errorf("copying file /%s: %w", p, err)
		}
		out = df
	}
	sum, _, err := r.sum(out)
	if err != nil {
		return "", 0, fmt.Errorf("copying file /%s: %w", p, err)
	}
	if err := finish(dfd, uid, gid, st.Mode&0o7777, times); err != nil {
		return "", 0, fmt.Errorf("copying file /%s: %w", p, err)
	}
	c.remember(key, &st, sum)
	return sum, st.Size, nil
}

// reader reads the regular file sfd (sf, with st) extent by extent: the
// data beyond what st's allocated blocks paid for (charged before it is
// read) is charged as it is read.
func (c *layerCopy) reader(sfd int, sf *os.File, st *unix.Stat_t) *sparseReader {
	if c.buf == nil {
		c.buf = make([]byte, fileChunk)
	}
	paid := st.Blocks * 512
	return &sparseReader{ctx: c.ctx, f: sf, fd: sfd, size: st.Size, buf: c.buf, charge: func(n int64) error {
		if n <= paid {
			paid -= n
			return nil
		}
		n, paid = n-paid, 0
		return c.charge(n)
	}}
}

// finish sets a copied file's owner, mode and times (the owner first: a
// chown clears setuid bits).
func finish(fd, uid, gid int, mode uint32, times []unix.Timespec) error {
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return err
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), times, 0)
}

// copyXattrs copies the user.* extended attributes (the overlay's own
// among them: an opaque directory stays opaque).
func copyXattrs(src, dst int) error {
	buf := make([]byte, 4096)
	n, err := unix.Flistxattr(src, buf)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.ERANGE) {
			return nil
		}
		return err
	}
	val := make([]byte, 4096)
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if !strings.HasPrefix(name, "user.") {
			continue
		}
		vn, err := unix.Fgetxattr(src, name, val)
		if err != nil {
			continue // gone, or too large to keep
		}
		if err := unix.Fsetxattr(dst, name, val[:vn], 0); err != nil {
			return err
		}
	}
	return nil
}
