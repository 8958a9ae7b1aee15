package native

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation"
)

// bindTree returns the detached, idmapped mount of a bind's source and
// whether it is a directory. The source is opened once, without following
// a symlink; the path the kernel gives for that descriptor passes
// isolation.CheckBindSource, and its owner is read and its tree cloned
// through the same descriptor: a path swapped meanwhile cannot change what
// is mounted.
//
// The source's owner becomes the sandbox's user on the bind, whoever it
// is (root, for a root user's project): what the sandbox's user writes
// there lands owned by that owner. Every other host id is unmapped, so
// the sandbox's root and other users can create nothing there. A
// read-only bind of a directory of root's maps nobody instead, so that
// root's files in a system place bound read-only (/etc) stay not the
// user's. rootsRW reports a writable bind of root's: the sandbox's user
// is host root there, and the sandbox must then lack CAP_SETFCAP
// (nsinit.Config.NoSetFCap).
func (s *sandbox) bindTree(ctx context.Context, bd isolation.Bind, hostUID uint32) (fd int, isDir, rootsRW bool, err error) {
	src, err := unix.Openat2(unix.AT_FDCWD, bd.HostPath, &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return -1, false, false, fmt.Errorf("bind source %s: %w", bd.HostPath, err)
	}
	defer unix.Close(src)
	opened, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", src))
	if err != nil {
		return -1, false, false, fmt.Errorf("bind source %s: %w", bd.HostPath, err)
	}
	dirs := append([]string{s.b.opts.StateDir}, s.b.opts.FenceDirs...)
	if err := isolation.CheckBindSource(opened, bd.ReadOnly, dirs...); err != nil {
		return -1, false, false, fmt.Errorf("bind source %s: %w", bd.HostPath, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return -1, false, false, fmt.Errorf("bind source %s: %w", bd.HostPath, err)
	}
	owner, group := st.Uid, st.Gid
	if owner == 0 && bd.ReadOnly {
		owner, group = nobodyID, nobodyID
	}
	if !bd.ReadOnly && (owner == 0 || group == 0) {
		if err := checkNoPrivileged(ctx, src, st.Mode&unix.S_IFMT == unix.S_IFDIR, opened); err != nil {
			return -1, false, false, fmt.Errorf("bind source %s: %w", bd.HostPath, err)
		}
	}
	bns, err := bindUserNS(s.b.exe, owner, group, hostUID+sandboxUserID)
	if err != nil {
		return -1, false, false, fmt.Errorf("bind %s: %w", bd.HostPath, err)
	}
	defer unix.Close(bns)
	tree, err := unix.OpenTree(src, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, false, false, fmt.Errorf("cloning %s: %w", bd.HostPath, err)
	}
	if err := idmap(tree, bns, bd.ReadOnly); err != nil {
		unix.Close(tree)
		return -1, false, false, fmt.Errorf("idmapping %s: %w", bd.HostPath, err)
	}
	return tree, st.Mode&unix.S_IFMT == unix.S_IFDIR, owner == 0, nil
}

// checkNoPrivileged refuses a writable bind of root's (owner or group)
// that holds a set-user-ID or set-group-ID file, or one with file
// capabilities: the sandbox's user is root there and could rewrite the
// file through a shared mapping (which, unlike write(2), keeps those
// bits), for anyone on the host to run. src is the opened source, a directory if dir, name
// the path to report it under. The sandbox itself cannot make such files
// (seccomp refuses set-id modes, NoSetFCap the capabilities); the walk
// costs a stat and an xattr read per file, only writable binds of root's
// take it, and it ends with ctx.
func checkNoPrivileged(ctx context.Context, src int, dir bool, name string) error {
	fdPath := fmt.Sprintf("/proc/self/fd/%d", src)
	if !dir {
		return checkFilePrivileged(fdPath, name, unix.Stat, unix.Getxattr)
	}
	root := fdPath + "/"
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return checkFilePrivileged(p, filepath.Join(name, strings.TrimPrefix(p, root)), unix.Lstat, unix.Lgetxattr)
	})
}

// checkFilePrivileged is checkNoPrivileged for the one file at p.
func checkFilePrivileged(p, name string, stat func(string, *unix.Stat_t) error, getxattr func(string, string, []byte) (int, error)) error {
	var st unix.Stat_t
	if err := stat(p, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		return fmt.Errorf("%w: %s is set-user-ID or set-group-ID (mode %o): the sandbox's user, root's stand-in there, could rewrite it for anyone on the host to run; remove the bit or bind read-only (:ro)", isolation.ErrBindRefused, name, st.Mode&0o7777)
	}
	if _, err := getxattr(p, "security.capability", nil); err == nil {
		return fmt.Errorf("%w: %s has file capabilities: the sandbox's user, root's stand-in there, could rewrite it for anyone on the host to run; remove them (setcap -r) or bind read-only (:ro)", isolation.ErrBindRefused, name)
	}
	return nil
}

// nobodyID is the host id a read-only bind of root's maps to the
// sandbox's user instead of root, so that root's files stay not the
// user's.
const nobodyID = 65534

// idmap makes the detached tree nosuid, nodev (and read-only) and idmapped
// through userns.
func idmap(tree, userns int, readOnly bool) error {
	set := uint64(unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if readOnly {
		set |= unix.MOUNT_ATTR_RDONLY
	}
	attr := &unix.MountAttr{Attr_set: set, Userns_fd: uint64(userns)}
	return unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr)
}

// idmappedTree returns a detached, nosuid, nodev clone of the tree at
// path, idmapped through the user namespace userns: on-disk id N appears
// as what N maps to there.
func idmappedTree(path string, userns int, readOnly bool) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return -1, fmt.Errorf("cloning %s: %w", path, err)
	}
	set := uint64(unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if readOnly {
		set |= unix.MOUNT_ATTR_RDONLY
	}
	attr := &unix.MountAttr{Attr_set: set, Userns_fd: uint64(userns)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("idmapping %s: %w", path, err)
	}
	return fd, nil
}
