package native

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation"
)

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
	// prev indexes the previous checkpoint's entries (nil: none), next
	// this one's; stableBefore is the ctime before which an entry counts
	// as stable. kids lists each indexed directory's names (by the
	// directory's key, "" for the root), prevKids the previous one's.
	prev, next     map[string]prevFile
	kids, prevKids map[string][]string
	stableBefore   time.Time
	// layer is the layer being made; prevLayer the one prev's files are
	// linked from in a full copy (its tree walked beside the source).
	layer, prevLayer string
	// A delta from the watcher's record (watchdelta.go): pend holds the
	// directories opened for its keys, by key; covered the keys walked
	// whole or whited out; touched the names examined in each directory;
	// replaced the keys the index had that were examined; force the keys
	// copied whatever their stamps say.
	pend     map[string]*pendingDir
	covered  map[string]bool
	touched  map[string][]string
	replaced []string
	force    map[string]bool
	linked   map[uint64]bool // inodes of several names examined
	// prevInos indexes prev's regular files by inode.
	prevInos inodeIndex
	// examined counts the entries read (one fstatat each); looked the
	// keys of the index by inode looked at.
	examined, looked int
}

// prevFile is what identifies an entry of the writable layer as
// unchanged since a checkpoint indexed it: the same inode of the same
// type with the same change time and size (a write, truncate, chmod,
// chown, rename, utimes or a change of a directory's names sets the
// change time; the sandbox cannot set it back), indexed while stable
// (its change time far enough before the checkpoint).
type prevFile struct {
	ino    uint64
	ctime  unix.Timespec
	size   int64
	sha    string
	typ    uint32 // unix.S_IFMT bits
	stable bool
	opaque bool // a directory the writable layer marks opaque
	// layer is the checkpoint layer whose tree holds the entry as it is.
	layer string
}

// unchanged reports whether st is the entry pf indexed, as it was.
func (pf prevFile) unchanged(st *unix.Stat_t) bool {
	return pf.stable && pf.typ == st.Mode&unix.S_IFMT && pf.ino == st.Ino && pf.ctime == st.Ctim && pf.size == st.Size
}

// lastCheckpoint is a sandbox's previous checkpoint: its layer, that
// layer's depth, and the index of the writable layer's entries then.
type lastCheckpoint struct {
	layer string
	depth int
	files map[string]prevFile
	kids  map[string][]string
	// dirs maps the inode of each indexed directory to its key; unstable
	// lists the keys indexed while not stable (examined again next time).
	dirs     map[uint64]string
	unstable []string
	// inos indexes the regular files by inode (inodes.go).
	inos inodeIndex
}

// stableMargin keeps out of the index the files whose change time is so
// close to the checkpoint that a write right after it could get the same
// (coarse) timestamp.
const stableMargin = 50 * time.Millisecond

// remember indexes an entry the layer being made holds, for the next
// checkpoint.
func (c *layerCopy) remember(path string, st *unix.Stat_t, sum string, opaque bool) {
	if c.next == nil {
		return
	}
	c.next[path] = prevFile{ino: st.Ino, ctime: st.Ctim, size: st.Size, sha: sum, typ: st.Mode & unix.S_IFMT,
		stable: time.Unix(st.Ctim.Unix()).Before(c.stableBefore), opaque: opaque, layer: c.layer}
}

// listed adds name to the index's names of the directory at rel.
func (c *layerCopy) listed(rel, name string) {
	if c.kids != nil {
		k := dirKey(rel)
		c.kids[k] = append(c.kids[k], name)
	}
}

// dirKey is the index key of the directory at rel ("" or "a/b/").
func dirKey(rel string) string {
	if rel == "" {
		return ""
	}
	return "/" + strings.TrimSuffix(rel, "/")
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
	c.examined++
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
		c.remember(e.Path, &st, "", false)
		c.listed(rel, name)
		return c.add(e)
	case unix.S_IFDIR:
		e.Kind = "dir"
		sfd, opaque, err := openLayerDir(src, name, p)
		if err != nil || sfd < 0 {
			return err
		}
		defer unix.Close(sfd)
		e.Opaque = opaque
		c.remember(e.Path, &st, "", opaque)
		c.listed(rel, name)
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
		c.remember(e.Path, &st, "", false)
		c.listed(rel, name)
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
		c.remember(e.Path, &st, "", false)
		c.listed(rel, name)
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
		c.listed(rel, name)
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
		if pf, ok := c.prev[key]; ok && pf.layer == c.prevLayer && pf.unchanged(&st) {
			if unix.Linkat(prev, name, dst, name, 0) == nil {
				c.remember(key, &st, pf.sha, false)
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
	c.remember(key, &st, sum, false)
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
func copyXattrs(src, dst int) error { return copyXattrsBut(src, dst, "") }

// copyXattrsBut is copyXattrs leaving out the attribute skip.
func copyXattrsBut(src, dst int, skip string) error {
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
		if !strings.HasPrefix(name, "user.") || name == skip {
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
