package volume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
)

// The content API works on a volume's files from the host, where a
// sandbox that mounts the volume may have made any of them a symlink (to
// /etc/shadow, say). Nothing here follows one: every path is resolved from
// the volume's root descriptor with openat2 RESOLVE_BENEATH,
// RESOLVE_NO_SYMLINKS, RESOLVE_NO_MAGICLINKS and RESOLVE_NO_XDEV, and the
// last element is opened with O_NOFOLLOW or examined with
// AT_SYMLINK_NOFOLLOW. A symlink is listed and stated as a symlink, never
// read, written, listed into or changed through.

// ErrFull wraps the errors of writes past a volume's size.
var ErrFull = errors.New("volume is full")

const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// maxDepth bounds a listing's depth and a removal's nesting.
const maxDepth = 64

// Content is one volume's files, opened for one request. Close it.
type Content struct {
	root int
	vol  store.Volume
}

// Open opens volume v's root for the content API.
func (s *Service) Open(v store.Volume) (*Content, error) {
	fd, err := unix.Open(s.fs.Path(v.ID), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening volume %s: %w", v.ID, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil || st.Type != unix.EXT4_SUPER_MAGIC {
		unix.Close(fd)
		return nil, fmt.Errorf("volume %s is not mounted: %w", v.ID, api.ErrUnavailable)
	}
	return &Content{root: fd, vol: v}, nil
}

// Close releases the root descriptor.
func (c *Content) Close() error { return unix.Close(c.root) }

// FileOptions of a write or mkdir: the owner and mode of what is made, and
// force (mkdir: make parents, accept an existing directory; write:
// replace an existing file, make parents).
type FileOptions struct {
	UID, GID *uint32
	Mode     *uint32
	Force    bool
}

// ParseFileOptions reads uid, gid, mode and force from a query.
func ParseFileOptions(get func(string) string) (FileOptions, error) {
	var o FileOptions
	for _, f := range []struct {
		name string
		dst  **uint32
		max  uint64
	}{{"uid", &o.UID, 65535}, {"gid", &o.GID, 65535}, {"mode", &o.Mode, 0o777}} {
		v := get(f.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n > f.max {
			return o, fmt.Errorf("%s must be a decimal number from 0 to %d, got %q: %w", f.name, f.max, v, api.ErrInvalidArgument)
		}
		u := uint32(n)
		*f.dst = &u
	}
	switch v := get("force"); v {
	case "", "false":
	case "true":
		o.Force = true
	default:
		return o, fmt.Errorf("force must be true or false, got %q: %w", v, api.ErrInvalidArgument)
	}
	return o, nil
}

// clean checks a request's path and returns it relative to the root
// ("." for the root) and absolute, clean, for answers.
func clean(p string) (rel, abs string, err error) {
	if p == "" {
		return "", "", fmt.Errorf("path is required: %w", api.ErrInvalidArgument)
	}
	if strings.ContainsRune(p, 0) || len(p) > 4096 {
		return "", "", fmt.Errorf("invalid path: %w", api.ErrInvalidArgument)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", "", fmt.Errorf("path %q: .. is not allowed: %w", p, api.ErrInvalidArgument)
		}
	}
	abs = path.Clean("/" + p)
	if abs == "/" {
		return ".", abs, nil
	}
	return abs[1:], abs, nil
}

// fsError maps a file operation's errno to the API's taxonomy.
func fsError(op, p string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		//lint:ignore ST1005 E2B's wording of the error
		return fmt.Errorf("Path %s not found: %w", p, api.ErrNotFound)
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%s %s: the path goes through a symlink, which is never followed: %w", op, p, api.ErrInvalidArgument)
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("%s %s: it exists already: %w", op, p, api.ErrConflict)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%s %s: a parent is not a directory: %w", op, p, api.ErrInvalidArgument)
	case errors.Is(err, unix.EISDIR):
		return fmt.Errorf("%s %s: it is a directory: %w", op, p, api.ErrInvalidArgument)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return fmt.Errorf("%s %s: %w", op, p, ErrFull)
	case errors.Is(err, unix.ENAMETOOLONG):
		return fmt.Errorf("%s %s: name too long: %w", op, p, api.ErrInvalidArgument)
	}
	return fmt.Errorf("%s %s: %w", op, p, err)
}

// openDir opens the directory rel beneath the root.
func (c *Content) openDir(rel string) (int, error) {
	return unix.Openat2(c.root, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags})
}

// parent opens the directory holding rel and returns it with rel's base.
func (c *Content) parent(rel string) (int, string, error) {
	dir, base := path.Split(rel)
	if dir == "" {
		dir = "."
	}
	fd, err := c.openDir(dir)
	return fd, base, err
}

// Stat describes the entry at p.
func (c *Content) Stat(p string) (*api.VolumeEntryStat, error) {
	rel, abs, err := clean(p)
	if err != nil {
		return nil, err
	}
	if rel == "." {
		return statAt(c.root, "", abs)
	}
	dir, base, err := c.parent(rel)
	if err != nil {
		return nil, fsError("stat", abs, err)
	}
	defer unix.Close(dir)
	st, err := statAt(dir, base, abs)
	if err != nil {
		return nil, fsError("stat", abs, err)
	}
	return st, nil
}

// statAt describes name in dir (dir itself if name is ""), never
// following a symlink.
func statAt(dir int, name, abs string) (*api.VolumeEntryStat, error) {
	var st unix.Stat_t
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if err := unix.Fstatat(dir, name, &st, flags); err != nil {
		return nil, err
	}
	out := &api.VolumeEntryStat{Name: path.Base(abs), Path: abs, Size: st.Size, Mode: st.Mode & 0o777,
		UID: st.Uid, GID: st.Gid, Atime: ts(st.Atim), Mtime: ts(st.Mtim), Ctime: ts(st.Ctim)}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		out.Type = "file"
	case unix.S_IFDIR:
		out.Type = "directory"
	case unix.S_IFLNK:
		out.Type = "symlink"
		buf := make([]byte, 4096)
		if n, err := unix.Readlinkat(dir, name, buf); err == nil {
			out.Target = string(buf[:n])
		}
	default:
		out.Type = "unknown"
	}
	return out, nil
}

func ts(t unix.Timespec) time.Time { return time.Unix(t.Sec, t.Nsec).UTC() }

// List lists the directory at p, depth levels deep (1: its entries).
func (c *Content) List(ctx context.Context, p string, depth int) ([]api.VolumeEntryStat, error) {
	rel, abs, err := clean(p)
	if err != nil {
		return nil, err
	}
	if depth < 1 || depth > maxDepth {
		return nil, fmt.Errorf("depth must be from 1 to %d: %w", maxDepth, api.ErrInvalidArgument)
	}
	fd, err := c.openDir(rel)
	if err != nil {
		return nil, fsError("list", abs, err)
	}
	out := []api.VolumeEntryStat{}
	err = listAt(ctx, fd, abs, depth, &out)
	unix.Close(fd)
	if err != nil {
		return nil, fsError("list", abs, err)
	}
	return out, nil
}

// maxEntries bounds a listing.
const maxEntries = 100000

func listAt(ctx context.Context, fd int, abs string, depth int, out *[]api.VolumeEntryStat) error {
	names, err := readNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		if len(*out) >= maxEntries {
			return fmt.Errorf("more than %d entries: %w", maxEntries, api.ErrInvalidArgument)
		}
		st, err := statAt(fd, n, path.Join(abs, n))
		if err != nil {
			continue // gone meanwhile
		}
		*out = append(*out, *st)
		if st.Type == "directory" && depth > 1 {
			sub, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			err = listAt(ctx, sub, st.Path, depth-1, out)
			unix.Close(sub)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// readNames lists a directory through a duplicate of fd.
func readNames(fd int) ([]string, error) {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	return f.Readdirnames(-1)
}

// Read opens the regular file at p for reading.
func (c *Content) Read(p string) (*os.File, int64, error) {
	rel, abs, err := clean(p)
	if err != nil {
		return nil, 0, err
	}
	fd, err := unix.Openat2(c.root, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK, Resolve: resolveFlags})
	if err != nil {
		return nil, 0, fsError("read", abs, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, 0, fmt.Errorf("read %s: not a regular file: %w", abs, api.ErrInvalidArgument)
	}
	return os.NewFile(uintptr(fd), abs), st.Size, nil
}

// Write writes r to the file at p: a new file, or with Force an existing
// one replaced (truncated). Its owner and mode are o's (default
// OwnerID:OwnerID, 0644).
func (c *Content) Write(p string, r io.Reader, o FileOptions) (*api.VolumeEntryStat, error) {
	rel, abs, err := clean(p)
	if err != nil {
		return nil, err
	}
	if rel == "." {
		return nil, fmt.Errorf("write /: it is the volume's root: %w", api.ErrInvalidArgument)
	}
	if o.Force {
		if err := c.mkdirAll(path.Dir(rel), o); err != nil {
			return nil, fsError("write", abs, err)
		}
	}
	dir, base, err := c.parent(rel)
	if err != nil {
		return nil, fsError("write", abs, err)
	}
	defer unix.Close(dir)
	mode := uint32(0o644)
	if o.Mode != nil {
		mode = *o.Mode
	}
	flags := unix.O_WRONLY | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK
	if o.Force {
		flags |= unix.O_TRUNC
	} else {
		flags |= unix.O_EXCL
	}
	fd, err := unix.Openat(dir, base, flags, mode)
	if err != nil {
		return nil, fsError("write", abs, err)
	}
	f := os.NewFile(uintptr(fd), abs)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("write %s: not a regular file: %w", abs, api.ErrInvalidArgument)
	}
	err = writeBody(f, r, o, mode)
	if err != nil {
		if !o.Force {
			// A new file that failed half-way is not left behind.
			unix.Unlinkat(dir, base, 0)
		}
		return nil, err
	}
	return statAt(dir, base, abs)
}

// writeBody sets f's owner and mode and writes r into it, synced.
func writeBody(f *os.File, r io.Reader, o FileOptions, mode uint32) error {
	if err := own(int(f.Fd()), o, mode); err != nil {
		return fsError("write", f.Name(), err)
	}
	if _, err := io.Copy(f, r); err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return fsError("write", f.Name(), pe.Err)
		}
		return fmt.Errorf("write %s: reading the body: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		return fsError("write", f.Name(), err)
	}
	return nil
}

// own sets fd's owner (o's, default OwnerID) and mode.
func own(fd int, o FileOptions, mode uint32) error {
	uid, gid := uint32(OwnerID), uint32(OwnerID)
	if o.UID != nil {
		uid = *o.UID
	}
	if o.GID != nil {
		gid = *o.GID
	}
	if err := unix.Fchown(fd, int(uid), int(gid)); err != nil {
		return err
	}
	return unix.Fchmod(fd, mode)
}

// MakeDir makes the directory at p; with Force its parents too, and an
// existing directory is no error.
func (c *Content) MakeDir(p string, o FileOptions) (*api.VolumeEntryStat, error) {
	rel, abs, err := clean(p)
	if err != nil {
		return nil, err
	}
	if o.Force {
		if err := c.mkdirAll(rel, o); err != nil {
			return nil, fsError("mkdir", abs, err)
		}
		return c.Stat(abs)
	}
	if rel == "." {
		return nil, fmt.Errorf("mkdir /: it exists already: %w", api.ErrConflict)
	}
	dir, base, err := c.parent(rel)
	if err != nil {
		return nil, fsError("mkdir", abs, err)
	}
	defer unix.Close(dir)
	if err := c.mkdirAt(dir, base, o); err != nil {
		return nil, fsError("mkdir", abs, err)
	}
	st, err := statAt(dir, base, abs)
	if err != nil {
		return nil, fsError("mkdir", abs, err)
	}
	return st, nil
}

// mkdirAt makes name in dir with o's owner and mode (default 0755).
func (c *Content) mkdirAt(dir int, name string, o FileOptions) error {
	mode := uint32(0o755)
	if o.Mode != nil {
		mode = *o.Mode
	}
	if err := unix.Mkdirat(dir, name, mode); err != nil {
		return err
	}
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return own(fd, o, mode)
}

// mkdirAll makes rel and its missing parents, one element at a time
// from the root, never through a symlink.
func (c *Content) mkdirAll(rel string, o FileOptions) error {
	if rel == "." || rel == "" {
		return nil
	}
	dir, err := unix.Openat(c.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	for _, el := range strings.Split(rel, "/") {
		if el == "" || el == "." {
			continue
		}
		if err := c.mkdirAt(dir, el, o); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(dir)
			return err
		}
		next, err := unix.Openat(dir, el, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(dir)
		if err != nil {
			return err
		}
		dir = next
	}
	return unix.Close(dir)
}

// Remove removes the entry at p, a directory with everything in it. The
// root cannot be removed.
func (c *Content) Remove(ctx context.Context, p string) error {
	rel, abs, err := clean(p)
	if err != nil {
		return err
	}
	if rel == "." {
		return fmt.Errorf("remove /: the volume's root cannot be removed: %w", api.ErrInvalidArgument)
	}
	dir, base, err := c.parent(rel)
	if err != nil {
		return fsError("remove", abs, err)
	}
	defer unix.Close(dir)
	if err := removeAt(ctx, dir, base, 0); err != nil {
		return fsError("remove", abs, err)
	}
	return nil
}

// removeAt removes name in dir, recursively, through descriptors.
func removeAt(ctx context.Context, dir int, name string, depth int) error {
	err := unix.Unlinkat(dir, name, 0)
	if err == nil || !errors.Is(err, unix.EISDIR) {
		return err
	}
	if depth > 4*maxDepth {
		return fmt.Errorf("nested deeper than %d: %w", 4*maxDepth, api.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sub, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := readNames(sub)
	if err == nil {
		for _, n := range names {
			if err = removeAt(ctx, sub, n, depth+1); err != nil && !errors.Is(err, unix.ENOENT) {
				break
			}
			err = nil
		}
	}
	unix.Close(sub)
	if err != nil {
		return err
	}
	return unix.Unlinkat(dir, name, unix.AT_REMOVEDIR)
}

// SetMetadata changes the owner and mode of the entry at p (a symlink's
// owner only).
func (c *Content) SetMetadata(p string, m api.VolumeMetadata) (*api.VolumeEntryStat, error) {
	rel, abs, err := clean(p)
	if err != nil {
		return nil, err
	}
	if m.Mode != nil && *m.Mode > 0o777 {
		return nil, fmt.Errorf("mode must be permission bits (at most 0777): %w", api.ErrInvalidArgument)
	}
	for _, id := range []*uint32{m.UID, m.GID} {
		if id != nil && *id > 65535 {
			return nil, fmt.Errorf("uid and gid must be at most 65535: %w", api.ErrInvalidArgument)
		}
	}
	var fd int
	if rel == "." {
		fd, err = unix.Openat(c.root, ".", unix.O_PATH|unix.O_CLOEXEC, 0)
	} else {
		fd, err = unix.Openat2(c.root, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveFlags})
	}
	if err != nil {
		return nil, fsError("update", abs, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fsError("update", abs, err)
	}
	if m.UID != nil || m.GID != nil {
		uid, gid := -1, -1
		if m.UID != nil {
			uid = int(*m.UID)
		}
		if m.GID != nil {
			gid = int(*m.GID)
		}
		if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return nil, fsError("update", abs, err)
		}
	}
	if m.Mode != nil {
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return nil, fmt.Errorf("update %s: a symlink has no mode of its own: %w", abs, api.ErrInvalidArgument)
		}
		// The O_PATH descriptor's magic link names exactly the inode
		// opened above, whatever replaced its name since.
		if err := unix.Fchmodat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), *m.Mode, 0); err != nil {
			return nil, fsError("update", abs, err)
		}
	}
	st2, err := statAt(fd, "", abs)
	if err != nil {
		return nil, fsError("update", abs, err)
	}
	return st2, nil
}
