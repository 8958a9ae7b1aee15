package native

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation"
)

// A delta from the watcher's record (watch.go).
//
// The keys examined are those the record names (a directory's path in the
// previous checkpoint's index, then the name), the entries indexed as
// not yet stable, and the files held open for writing or mapped shared
// (placed by their inode in the index by inode, inodes.go: the work is
// the changes' and the held files', not the layer's).
// A record names an entry by the inode of its directory: a directory the
// index does not know was made or moved in since, and its making or
// moving is itself recorded in a directory the index knows (by
// induction, up to the layer's root), so examining the keys the index
// can place reaches every change; a key that no longer names what it did
// (a directory renamed, a number reused) is examined all the same and
// only costs a look.
//
// Each key is examined as the walk (delta.go) examines an entry: copied
// if it changed, whited out if it went, and, for a directory made anew,
// walked whole. A directory that is the same as the index's keeps its
// entries: those that changed have keys of their own. Keys below one
// walked whole or whited out are skipped.

// watchedKeys returns the keys to examine for a delta on last, from the
// watcher's record, and sets those c copies whatever their stamps say
// (the files held). The sandbox is frozen.
//
// +checklocks:s.pmu
func (s *sandbox) watchedKeys(c *layerCopy, rec map[uint64]map[string]struct{}, last *lastCheckpoint, upper int) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(upper, &st); err != nil {
		return nil, fmt.Errorf("reading the writable layer: %w", err)
	}
	keys := map[string]struct{}{}
	for ino, names := range rec {
		dir, ok := last.dirs[ino]
		if ino == st.Ino {
			dir, ok = "", true
		}
		if !ok {
			continue
		}
		for name := range names {
			switch {
			case name == ".":
				if dir != "" {
					keys[dir] = struct{}{}
				}
			case name == "" || name == ".." || strings.ContainsRune(name, '/'):
			default:
				keys[dir+"/"+name] = struct{}{}
			}
		}
	}
	for _, k := range last.unstable {
		keys[k] = struct{}{}
	}
	pids, err := s.cg.Pids()
	if err != nil {
		return nil, err
	}
	held, err := heldInodes(pids)
	if err != nil {
		return nil, fmt.Errorf("listing the sandbox's open files: %w", err)
	}
	c.force = map[string]bool{}
	c.prevInos = last.inos
	for ino := range held {
		last.inos.regular(last.files, ino, &c.looked, func(k string) {
			keys[k] = struct{}{}
			c.force[k] = true
		})
	}
	out := slices.Collect(maps.Keys(keys))
	slices.Sort(out)
	return out, nil
}

// deltaKeys copies into the delta what changed at keys (sorted) since the
// indexed checkpoint; root is the layer's root.
func (c *layerCopy) deltaKeys(root *pendingDir, keys []string) error {
	c.pend = map[string]*pendingDir{"": root}
	c.covered = map[string]bool{}
	c.touched = map[string][]string{}
	defer c.closePending()
	c.linked = map[uint64]bool{}
	done := map[string]bool{}
	for len(keys) > 0 {
		if err := c.deltaKeysOnce(keys, done); err != nil {
			return err
		}
		// A file of several names changed through one of them: its other
		// names, which no event names, are examined too.
		keys = nil
		for ino := range c.linked {
			c.prevInos.regular(c.prev, ino, &c.looked, func(k string) {
				if !done[k] {
					keys = append(keys, k)
				}
			})
		}
		slices.Sort(keys)
		clear(c.linked)
	}
	return c.finishPending()
}

// deltaKeysOnce examines keys (sorted), those not examined yet.
func (c *layerCopy) deltaKeysOnce(keys []string, done map[string]bool) error {
	for _, key := range keys {
		if done[key] {
			continue
		}
		done[key] = true
		if c.isCovered(key) {
			continue
		}
		i := strings.LastIndexByte(key, '/')
		dir, name := key[:i], key[i+1:]
		depth := strings.Count(dir, "/")
		if depth > maxLayerDepth {
			return fmt.Errorf("%s: nested deeper than %d directories", dir, maxLayerDepth)
		}
		d, err := c.pending(dir)
		if err != nil {
			return err
		}
		if d == nil {
			continue // gone: its going is the change of a key above
		}
		rel := strings.TrimPrefix(dir+"/", "/")
		c.touched[dir] = append(c.touched[dir], name)
		if err := c.deltaKey(d, rel, name, depth); err != nil {
			return err
		}
	}
	return nil
}

// finishPending copies the attributes of the directories whose names
// changed and finishes the delta's directories.
func (c *layerCopy) finishPending() error {
	// A directory whose names changed has a new change time: its copy
	// carries its attributes as the walk's does, whether or not anything
	// below it is kept.
	for dir := range c.touched {
		d := c.pend[dir]
		if dir == "" || d == nil || c.isCovered(dir+"/") {
			continue
		}
		if pf, ok := c.prev[dir]; ok && pf.unchanged(&d.st) {
			continue
		}
		if _, err := c.ensure(d); err != nil {
			return err
		}
	}
	dirs := slices.Collect(maps.Keys(c.pend))
	slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var errs []error
	for _, k := range dirs {
		if k != "" {
			errs = append(errs, c.finishDir(c.pend[k]))
			c.pend[k].fd = -1
		}
	}
	return errors.Join(errs...)
}

func (c *layerCopy) isCovered(key string) bool {
	for p := key; ; {
		i := strings.LastIndexByte(p, '/')
		if i <= 0 {
			return false
		}
		p = p[:i]
		if c.covered[p] {
			return true
		}
	}
}

// closePending closes the writable layer's directories opened for keys
// and the delta's copies of them.
func (c *layerCopy) closePending() {
	for k, d := range c.pend {
		if k == "" {
			continue
		}
		unix.Close(d.src)
		if d.fd >= 0 {
			unix.Close(d.fd)
		}
	}
}

// pending returns the directory at key in the writable layer, opened
// element by element from the root without following a symlink; nil when
// it is not there (or is no longer a directory).
func (c *layerCopy) pending(key string) (*pendingDir, error) {
	if d, ok := c.pend[key]; ok {
		return d, nil
	}
	i := strings.LastIndexByte(key, '/')
	parent, err := c.pending(key[:i])
	if err != nil || parent == nil {
		return nil, err
	}
	name := key[i+1:]
	var d *pendingDir
	fd, opaque, err := openLayerDir(parent.src, name, key[1:])
	switch {
	case errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP):
	case err != nil:
		return nil, err
	case fd >= 0:
		d = &pendingDir{parent: parent, name: name, src: fd, opaque: opaque, fd: -1, key: key}
		if err := unix.Fstat(fd, &d.st); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("reading layer directory %s: %w", key, err)
		}
	}
	if d != nil {
		c.pend[key] = d
	}
	return d, nil
}

// deltaKey examines the entry name of d as deltaEntry does, but keeps a
// directory that is the same as the index's without walking it, and
// whites out an entry the index had that went.
func (c *layerCopy) deltaKey(d *pendingDir, rel, name string, depth int) error {
	key := "/" + rel + name
	pf, had := c.prev[key]
	var st unix.Stat_t
	err := unix.Fstatat(d.src, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("reading layer entry %s: %w", key, err)
	}
	isDir := err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
	if err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1 {
		c.linked[st.Ino] = true
	}
	if isDir && had && pf.typ == unix.S_IFDIR && pf.ino == st.Ino {
		sub, err := c.pending(key)
		if err != nil {
			return err
		}
		if sub != nil && (!sub.opaque || pf.opaque) {
			c.replaced = append(c.replaced, key)
			c.listed(rel, name)
			if pf.unchanged(&sub.st) {
				c.next[key] = pf
				return nil
			}
			_, err := c.ensure(sub)
			return err
		}
		// Opaque now: made anew over what was below, copied whole.
		if sub != nil {
			delete(c.pend, key)
			unix.Close(sub.src)
		}
	}
	if err == nil && !isDir && c.force[key] {
		// Held open for writing or mapped: copied whatever its stamps say.
		pfd, err := c.ensure(d)
		if err != nil {
			return err
		}
		if err := c.entry(d.src, pfd, -1, rel, name, depth); err != nil {
			return err
		}
	} else if err == nil {
		if err := c.deltaEntry(d, rel, name, depth); err != nil {
			return err
		}
		if isDir {
			c.covered[key] = true
		}
	}
	if had {
		c.replaced = append(c.replaced, key)
		if _, kept := c.next[key]; !kept {
			fd, err := c.ensure(d)
			if err != nil {
				return err
			}
			if err := c.charge(entryCost); err != nil {
				return err
			}
			if err := unix.Mknodat(fd, name, unix.S_IFCHR, 0); err != nil {
				return fmt.Errorf("whiting out %s: %w", key, err)
			}
			c.covered[key] = true
			return c.add(isolation.FileChange{Path: key, Kind: "removed"})
		}
	}
	return nil
}

// nextCheckpoint makes the index of the checkpoint just made as layer,
// at depth: the walk's own (c.next, its directories and unstable entries
// listed once) or, after a delta from the record, the previous index with
// what the delta examined laid over it: in place when shared is false (no
// squash reads it; the sandbox's checkpoints are serialised, so nothing
// else does), else on a copy. The sandbox runs again: nothing here reads
// the writable layer.
func (c *layerCopy) nextCheckpoint(prev *lastCheckpoint, layer string, depth int, shared bool) *lastCheckpoint {
	l := &lastCheckpoint{layer: layer, depth: depth}
	if c.pend == nil {
		l.files, l.kids, l.dirs, l.inos = c.next, c.kids, map[uint64]string{}, inodesOf(c.next)
		for k, f := range c.next {
			if f.typ == unix.S_IFDIR {
				l.dirs[f.ino] = k
			}
			if !f.stable {
				l.unstable = append(l.unstable, k)
			}
		}
		return l
	}
	l.files, l.kids, l.dirs, l.inos = prev.files, prev.kids, prev.dirs, prev.inos
	if shared {
		l.files, l.kids, l.dirs, l.inos = maps.Clone(prev.files), maps.Clone(prev.kids), maps.Clone(prev.dirs), prev.inos.clone()
	}
	for _, key := range c.replaced {
		f := l.files[key]
		if f.typ == unix.S_IFDIR {
			if n, ok := c.next[key]; !ok || n.typ != unix.S_IFDIR || n.ino != f.ino || c.covered[key] {
				dropBelow(l, key)
			}
			if l.dirs[f.ino] == key {
				delete(l.dirs, f.ino)
			}
		}
		l.inos.drop(key, f)
		delete(l.files, key)
	}
	for k, f := range c.next {
		if old, ok := l.files[k]; ok {
			l.inos.drop(k, old)
		}
		l.inos.add(k, f)
		l.files[k] = f
		if f.typ == unix.S_IFDIR {
			l.dirs[f.ino] = k
		}
		if !f.stable {
			l.unstable = append(l.unstable, k)
		}
	}
	for _, k := range prev.unstable {
		if f, ok := l.files[k]; ok && !f.stable {
			if _, again := c.next[k]; !again {
				l.unstable = append(l.unstable, k)
			}
		}
	}
	for dir, names := range c.kids {
		if _, ok := c.touched[dir]; !ok {
			l.kids[dir] = names
		}
	}
	c.relist(l)
	return l
}

// relist updates the names l lists in the directories examined name by
// name: they change only where an examined name came or went, so the list
// of a large directory is not rebuilt.
func (c *layerCopy) relist(l *lastCheckpoint) {
	had := map[string]bool{}
	for _, k := range c.replaced {
		had[k] = true
	}
	for dir, names := range c.touched {
		gone := map[string]bool{}
		list := l.kids[dir]
		for _, n := range names {
			k := dir + "/" + n
			_, now := l.files[k]
			switch {
			case now && !had[k] && !gone[n]:
				list = append(list, n)
				had[k] = true // listed once however often examined
			case !now && had[k]:
				gone[n] = true
			}
		}
		if len(gone) > 0 {
			// A new slice: a squash in progress may read the old one.
			list = slices.DeleteFunc(slices.Clone(list), func(n string) bool { return gone[n] })
		}
		l.kids[dir] = list
	}
}

// dropBelow removes from the index l what it held below the directory
// key.
func dropBelow(l *lastCheckpoint, key string) {
	for _, n := range l.kids[key] {
		k := key + "/" + n
		f := l.files[k]
		if f.typ == unix.S_IFDIR {
			dropBelow(l, k)
			if l.dirs[f.ino] == k {
				delete(l.dirs, f.ino)
			}
		}
		l.inos.drop(k, f)
		delete(l.files, k)
	}
	delete(l.kids, key)
}
