package native

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation"
)

// Stacked checkpoints on the copy store.
//
// A sandbox's first checkpoint copies its writable layer whole (files
// unchanged since linked, see layerCopy); it also indexes every entry of
// the writable layer (inode, type, change time, size, and the layer
// holding its copy). Each later checkpoint is a delta stacked on the
// previous one: its layer holds only what changed since (entries whose
// inode, type, change time or size moved, directories whose attributes
// moved or under which something changed, and a whiteout for each entry
// gone), its parent is the previous checkpoint's layer, and a sandbox
// booted on it sees, through the overlay of the stack, exactly the
// writable layer as it was. A checkpoint with nothing changed costs a walk
// of the writable layer's names (one fstatat each) while frozen, no copy
// and no link. The sandbox is frozen throughout, as for a full copy.
//
// The stack is bounded: once a sandbox's deltas reach squashAfter, its
// checkpoints are squashed in the background (squash.go) into one layer
// on the sandbox's boot layer, made of hard links to the deltas' files
// (layers never change), and the next delta stacks on it. Should the stack
// reach maxLayerStack all the same (squashes failing), the checkpoint is a
// full copy.

// squashAfter is how many stacked deltas a sandbox's checkpoints reach
// before they are squashed in the background (a variable for tests).
var squashAfter = 8

// opaqueXattr marks a directory opaque in the overlay's user namespace
// mounts (userxattr).
const opaqueXattr = "user.overlay.opaque"

// pendingDir is a directory of the writable layer walked for a delta: its
// copy in the delta is made (ensure) only when something under it, or
// its own attributes, changed.
type pendingDir struct {
	parent *pendingDir
	name   string
	src    int // the writable layer's directory
	st     unix.Stat_t
	opaque bool // as the writable layer marks it
	fd     int  // its copy in the delta; -1 until made
	key    string
}

// ensure makes d's copy in the delta (and its parents'), without the
// opaque mark: the delta's directory merges with the same directory
// below it, and what went from it since is whited out name by name.
func (c *layerCopy) ensure(d *pendingDir) (int, error) {
	if d.fd >= 0 {
		return d.fd, nil
	}
	pfd, err := c.ensure(d.parent)
	if err != nil {
		return -1, err
	}
	if err := c.charge(entryCost); err != nil {
		return -1, err
	}
	if err := unix.Mkdirat(pfd, d.name, 0o700); err != nil {
		return -1, fmt.Errorf("copying directory %s: %w", d.key, err)
	}
	fd, err := unix.Openat(pfd, d.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("copying directory %s: %w", d.key, err)
	}
	d.fd = fd
	if err := copyXattrsBut(d.src, fd, opaqueXattr); err != nil {
		return -1, fmt.Errorf("copying directory %s: %w", d.key, err)
	}
	c.remember(d.key, &d.st, "", d.opaque)
	if c.mtimes != nil {
		c.mtimes[d.key] = d.st.Mtim
	}
	return fd, c.add(isolation.FileChange{Path: d.key, Kind: "dir", Mode: d.st.Mode & 0o7777})
}

// finishDir sets the attributes of d's copy, once its entries are in, and
// closes it.
func (c *layerCopy) finishDir(d *pendingDir) error {
	if d.fd < 0 {
		return nil
	}
	defer unix.Close(d.fd)
	if err := finish(d.fd, c.id(d.st.Uid), c.id(d.st.Gid), d.st.Mode&0o7777, []unix.Timespec{d.st.Atim, d.st.Mtim}); err != nil {
		return fmt.Errorf("copying directory %s: %w", d.key, err)
	}
	return nil
}

// delta copies into the delta what changed in the directory d (the
// writable layer's path rel) since the indexed checkpoint, and whites out
// the names gone from it.
func (c *layerCopy) delta(d *pendingDir, rel string, depth int) error {
	if depth > maxLayerDepth {
		return fmt.Errorf("/%s: nested deeper than %d directories", rel, maxLayerDepth)
	}
	err := walkDir(c.ctx, d.src, rel, func(name string) error {
		return c.deltaEntry(d, rel, name, depth)
	})
	if err != nil {
		return err
	}
	// Every entry kept now is in the new index.
	for _, name := range c.prevKids[d.key] {
		if _, ok := c.next[d.key+"/"+name]; ok {
			continue
		}
		fd, err := c.ensure(d)
		if err != nil {
			return err
		}
		if err := c.charge(entryCost); err != nil {
			return err
		}
		p := "/" + rel + name
		if err := unix.Mknodat(fd, name, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("whiting out %s: %w", p, err)
		}
		if err := c.add(isolation.FileChange{Path: p, Kind: "removed"}); err != nil {
			return err
		}
	}
	return nil
}

// deltaEntry copies the entry name of d into the delta if it changed
// since the indexed checkpoint, and indexes it (unless a layer does not
// keep it: a socket, a device node).
func (c *layerCopy) deltaEntry(d *pendingDir, rel, name string, depth int) error {
	p := rel + name
	key := "/" + p
	var st unix.Stat_t
	c.examined++
	if err := unix.Fstatat(d.src, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("reading layer entry %s: %w", key, err)
	}
	pf, had := c.prev[key]
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK, unix.S_IFBLK:
		return nil
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return nil
		}
	case unix.S_IFDIR:
		sfd, opaque, err := openLayerDir(d.src, name, p)
		if err != nil || sfd < 0 {
			return err
		}
		defer unix.Close(sfd)
		same := had && pf.typ == unix.S_IFDIR && pf.ino == st.Ino
		if opaque && (!same || !pf.opaque) {
			// Made anew over what was below: the delta's copy is opaque
			// and whole, as the writable layer's is.
			pfd, err := c.ensure(d)
			if err != nil {
				return err
			}
			return c.entry(d.src, pfd, -1, rel, name, depth)
		}
		sub := &pendingDir{parent: d, name: name, src: sfd, st: st, opaque: opaque, fd: -1, key: key}
		c.listed(rel, name)
		if same && pf.unchanged(&st) {
			c.next[key] = pf
		} else if _, err := c.ensure(sub); err != nil {
			return err
		}
		err = c.delta(sub, p+"/", depth+1)
		return errors.Join(err, c.finishDir(sub))
	}
	if had && pf.unchanged(&st) {
		c.next[key] = pf
		c.listed(rel, name)
		return nil
	}
	pfd, err := c.ensure(d)
	if err != nil {
		return err
	}
	return c.entry(d.src, pfd, -1, rel, name, depth)
}
