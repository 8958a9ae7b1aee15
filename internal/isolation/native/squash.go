package native

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation"
)

// squashTimeout bounds one background squash.
const squashTimeout = 5 * time.Minute

// HeldLayers implements isolation.LayerHolder: the layer the sandbox's
// next checkpoint stacks on, and those a squash in progress reads or
// makes.
func (s *sandbox) HeldLayers() []string {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	held := slices.Clone(s.squashing)
	if s.last != nil {
		held = append(held, s.last.layer)
	}
	return held
}

// startSquash squashes, in the background, the stack of deltas under
// last (the sandbox's checkpoint just made) into one layer on the
// sandbox's boot layer, unless a squash runs already; the sandbox's next
// checkpoint stacks on that layer if last is still its latest then. The
// caller holds s.pmu.
//
// +checklocks:s.pmu
func (s *sandbox) startSquash(last *lastCheckpoint) {
	if s.squashing != nil {
		return
	}
	chain, err := s.b.layerChain(last.layer)
	if err != nil {
		return
	}
	stack := chain[:len(chain)-len(s.chain)] // the checkpoints above the boot layer
	id := isolation.NewID()
	s.squashing = append(slices.Clone(stack), id)
	b := s.b
	b.squashes.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), squashTimeout)
		defer cancel()
		depth, err := b.squash(ctx, id, s.base, s.rootfs, stack, last)
		s.pmu.Lock()
		defer s.pmu.Unlock()
		s.squashing = nil
		if err != nil {
			b.log.Warn("squashing a sandbox's checkpoints", "sandbox_id", s.id, "layer", last.layer, "err", err)
			return
		}
		if s.last != last {
			return // a newer checkpoint stacks on last: this layer is the collector's
		}
		files := maps.Clone(last.files)
		for k, f := range files {
			f.layer = id
			files[k] = f
		}
		s.last = &lastCheckpoint{layer: id, depth: depth, files: files, kids: last.kids, dirs: last.dirs, unstable: last.unstable, inos: last.inos}
	})
}

// squash makes layer id on base (the template when "") holding what the
// stack of layers (top first, each the parent of the one before, the last
// on base) shows: every entry last indexes, hard-linked from the layer
// that holds it (directories made anew with its attributes). It returns
// the new layer's depth.
func (b *Backend) squash(ctx context.Context, id, base, rootfs string, stack []string, last *lastCheckpoint) (int, error) {
	depth := 1
	if base != "" {
		m, err := b.layerMeta(base)
		if err != nil {
			return 0, err
		}
		depth = m.Depth + 1
	}
	trees := map[string]int{}
	defer func() {
		for _, fd := range trees {
			unix.Close(fd)
		}
	}()
	for _, l := range stack {
		fd, err := unix.Open(b.layerTree(l), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0, fmt.Errorf("opening layer %s: %w", l, err)
		}
		trees[l] = fd
	}
	tmp := filepath.Join(b.layersDir(), layerTmpPrefix+id)
	if err := os.MkdirAll(filepath.Join(tmp, "tree"), 0o755); err != nil {
		return 0, fmt.Errorf("creating layer: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	dst, err := unix.Open(filepath.Join(tmp, "tree"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("opening layer: %w", err)
	}
	defer unix.Close(dst)
	sq := &squasher{ctx: ctx, trees: trees, last: last}
	if err := sq.dir("", dst, 0); err != nil {
		return 0, err
	}
	if err := unix.Fchown(dst, 0, 0); err != nil {
		return 0, fmt.Errorf("creating layer: %w", err)
	}
	// The entries the stack lists, merged as the overlay shows them.
	merged := map[string]isolation.FileChange{}
	for _, l := range slices.Backward(stack) {
		m, err := b.layerMeta(l)
		if err != nil {
			return 0, err
		}
		applyEntries(merged, m.Entries)
	}
	entries := slices.SortedFunc(maps.Values(merged), func(a, c isolation.FileChange) int { return strings.Compare(a.Path, c.Path) })
	m := &layerMeta{ID: id, Parent: base, Depth: depth, Bytes: int64(sq.n) * entryCost, Created: time.Now().UTC(),
		RootFS: rootfs, Entries: entries}
	if err := b.commitLayer(tmp, m); err != nil {
		return 0, err
	}
	ok = true
	return depth, nil
}

// squasher links the entries an index lists from the layers holding them.
type squasher struct {
	ctx   context.Context
	trees map[string]int // layer → its tree
	last  *lastCheckpoint
	n     int // entries made
}

// parentIn opens the directory holding key (an index key) in layer's tree.
func (q *squasher) parentIn(layer, key string) (int, string, error) {
	tree, ok := q.trees[layer]
	if !ok {
		return -1, "", fmt.Errorf("%s: its layer %s is not in the stack squashed", key, layer)
	}
	dir, name := filepath.Split(strings.TrimPrefix(key, "/"))
	if dir == "" {
		fd, err := unix.FcntlInt(uintptr(tree), unix.F_DUPFD_CLOEXEC, 0)
		return fd, name, err
	}
	fd, err := unix.Openat2(tree, dir, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV})
	if err != nil {
		return -1, "", fmt.Errorf("opening %s in layer %s: %w", dir, layer, err)
	}
	return fd, name, nil
}

// dir makes the entries of the indexed directory at rel ("" or "a/b/")
// in dst.
func (q *squasher) dir(rel string, dst, depth int) error {
	if depth > maxLayerDepth {
		return fmt.Errorf("/%s: nested deeper than %d directories", rel, maxLayerDepth)
	}
	if err := q.ctx.Err(); err != nil {
		return err
	}
	for _, name := range q.last.kids[dirKey(rel)] {
		key := "/" + rel + name
		f, ok := q.last.files[key]
		if !ok {
			return fmt.Errorf("%s: listed but not indexed", key)
		}
		if err := q.entry(rel, name, key, f, dst, depth); err != nil {
			return err
		}
		q.n++
	}
	return nil
}

func (q *squasher) entry(rel, name, key string, f prevFile, dst, depth int) error {
	src, sname, err := q.parentIn(f.layer, key)
	if err != nil {
		return err
	}
	defer unix.Close(src)
	if f.typ != unix.S_IFDIR {
		if err := unix.Linkat(src, sname, dst, name, 0); err != nil {
			return fmt.Errorf("linking %s from layer %s: %w", key, f.layer, err)
		}
		return nil
	}
	sfd, err := unix.Openat(src, sname, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s in layer %s: %w", key, f.layer, err)
	}
	defer unix.Close(sfd)
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return err
	}
	if err := unix.Mkdirat(dst, name, 0o700); err != nil {
		return fmt.Errorf("making %s: %w", key, err)
	}
	dfd, err := unix.Openat(dst, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("making %s: %w", key, err)
	}
	defer unix.Close(dfd)
	if err := copyXattrsBut(sfd, dfd, opaqueXattr); err != nil {
		return fmt.Errorf("making %s: %w", key, err)
	}
	if f.opaque {
		if err := unix.Fsetxattr(dfd, opaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("making %s: %w", key, err)
		}
	}
	if err := q.dir(rel+name+"/", dfd, depth+1); err != nil {
		return err
	}
	// The layer's ids are the sandbox's already.
	return finish(dfd, int(st.Uid), int(st.Gid), st.Mode&0o7777, []unix.Timespec{st.Atim, st.Mtim})
}
