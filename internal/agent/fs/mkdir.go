package fs

import (
	"errors"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/agent/users"
)

// ensureDir creates dir and its missing parents for u, as envd does:
// what it creates is owned by u, even where u may not create it (a
// missing top-level directory such as /data). It runs with u's
// credentials (inside asUser).
//
// It first creates the directories as u, following symlinks as u would:
// nothing is made that u could not make. Only where that is refused
// (permission denied) does it walk the path again one component at a
// time from /, with descriptors, following no symlink at all, looking
// each component up as u (so u's search permissions hold), and creating
// a missing one with the agent's own credentials only where u may not
// write its parent (nor own it), then handing it to u. A directory u may
// not write and does not own is one whose entries u cannot rename or
// replace, so nothing u does can redirect that creation; and a symlink anywhere on the path (one u
// planted, or any other) ends the walk with u's own error. Nothing is
// ever created through a symlink or in a directory u cannot search.
func ensureDir(dir string, u *users.User) error {
	err := mkdirAllAs(dir, u.UID, u.GID)
	if err == nil || !errors.Is(err, unix.EACCES) {
		return err
	}
	if werr := mkdirAllNoFollow(dir, u.UID, u.GID); werr != nil {
		return err // u's own answer: the walk found a symlink or u may not search
	}
	return nil
}

// mkdirAllAs creates dir and its missing parents with the caller's
// credentials, each owned by uid:gid.
func mkdirAllAs(dir string, uid, gid uint32) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return &os.PathError{Op: "mkdir", Path: dir, Err: unix.ENOTDIR}
		}
		return nil
	}
	if !errors.Is(err, iofs.ErrNotExist) {
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAllAs(parent, uid, gid); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, iofs.ErrExist) {
			if fi, serr := os.Stat(dir); serr == nil && fi.IsDir() {
				return nil
			}
		}
		return err
	}
	return os.Lchown(dir, int(uid), int(gid))
}

// mkdirAllNoFollow creates the absolute path dir and its missing parents,
// owned by uid:gid, walking from / with a descriptor per component and
// following no symlink (a symlink component is ENOTDIR or ELOOP). Lookups
// and creations run with the caller's credentials; a creation they are
// refused (EACCES: no write permission on a parent uid does not own) is
// made with the agent's own (asAgent) and the new directory chowned to
// uid:gid.
func mkdirAllNoFollow(dir string, uid, gid uint32) error {
	if !filepath.IsAbs(dir) {
		return &os.PathError{Op: "mkdir", Path: dir, Err: unix.EINVAL}
	}
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: "/", Err: err}
	}
	defer func() { unix.Close(fd) }()
	at := "/"
	for _, name := range strings.Split(filepath.Clean(dir), "/") {
		if name == "" {
			continue
		}
		at = filepath.Join(at, name)
		next, err := openDirNoFollow(fd, name)
		if errors.Is(err, unix.ENOENT) {
			err = unix.Mkdirat(fd, name, 0o755)
			if errors.Is(err, unix.EACCES) && !ownedBy(fd, uid) {
				parent := fd
				err = asAgent(func() error {
					if err := unix.Mkdirat(parent, name, 0o755); err != nil {
						return err
					}
					// u may not write parent: the new entry cannot have
					// been swapped since.
					return unix.Fchownat(parent, name, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW)
				})
			}
			if err != nil && !errors.Is(err, unix.EEXIST) {
				return &os.PathError{Op: "mkdir", Path: at, Err: err}
			}
			next, err = openDirNoFollow(fd, name)
		}
		if err != nil {
			return &os.PathError{Op: "open", Path: at, Err: err}
		}
		unix.Close(fd)
		fd = next
	}
	return nil
}

// ownedBy reports whether the directory fd belongs to uid, who could
// then make it writable and change its entries at any time: the agent
// creates nothing in it on uid's behalf.
func ownedBy(fd int, uid uint32) bool {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return true // unknown: as if it were
	}
	return st.Uid == uid
}

// openDirNoFollow opens the directory name in dirfd as an O_PATH
// descriptor, refusing a symlink (ELOOP).
func openDirNoFollow(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOTDIR) {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return -1, unix.ELOOP
		}
	}
	return fd, err
}
