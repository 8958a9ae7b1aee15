package native

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation"
)

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
	for i := len(chain) - 1; i >= 0; i-- {
		es, err := b.layerEntries(ctx, chain[i])
		if err != nil {
			return nil, err
		}
		applyEntries(merged, es)
	}
	applyEntries(merged, top)
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

// applyEntries lays the entries es of a layer over merged, the entries of
// the layers below it, as the overlay shows them: a removal or an opaque
// directory hides what was below it.
func applyEntries(merged map[string]isolation.FileChange, es []isolation.FileChange) {
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
