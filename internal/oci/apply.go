package oci

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// apply lays one extracted layer (dir, described by m) over the tree open
// as root: opaque directories are emptied and whiteouts removed first, then
// the layer's directories are made and its files and symlinks hard-linked
// in. Every path in root is resolved inside it.
func apply(root *os.Root, dir string, m layerMeta, copyFiles bool) error {
	for _, o := range m.Opaque {
		if err := emptyIn(root, o); err != nil {
			return err
		}
	}
	for _, w := range m.Whiteouts {
		if err := root.RemoveAll(w); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("whiteout %s: %w: %w", w, err, ErrInvalidImage)
		}
	}
	implicit := make(map[string]bool, len(m.Implicit))
	for _, d := range m.Implicit {
		implicit[d] = true
	}
	tree := filepath.Join(dir, treeDir)
	copied := map[uint64]string{} // inodes of the layer copied, not linked: their first name
	// The walk reads the cache's own tree (no symlink in it is followed);
	// only root, the destination, is resolved component by component.
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(tree, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return applyDir(root, p, rel, implicit[rel])
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		ino := fi.Sys().(*syscall.Stat_t).Ino
		if first, ok := copied[ino]; ok {
			// A hard link within the layer, whose first name was copied:
			// link to the copy.
			if err := root.RemoveAll(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("replacing %s: %w", rel, err)
			}
			return root.Link(first, rel)
		}
		didCopy, err := linkInto(root, p, rel, copyFiles)
		if didCopy {
			copied[ino] = rel
		}
		return err
	})
	if err != nil {
		return err
	}
	for _, l := range m.Links {
		if _, err := root.Lstat(l.Target); err != nil {
			return fmt.Errorf("hard link %s to %s, which no layer has: %w", l.Name, l.Target, ErrInvalidImage)
		}
		if err := root.RemoveAll(l.Name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("replacing %s: %w", l.Name, err)
		}
		if err := root.Link(l.Target, l.Name); err != nil {
			return fmt.Errorf("hard link %s to %s: %w: %w", l.Name, l.Target, err, ErrInvalidImage)
		}
	}
	return nil
}

// emptyIn removes the entries of directory d in root, if it is one.
func emptyIn(root *os.Root, d string) error {
	f, err := root.Open(d)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opaque directory %s: %w: %w", d, err, ErrInvalidImage)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return nil // not a directory: nothing below to hide
	}
	for _, n := range names {
		if err := root.RemoveAll(path.Join(d, n)); err != nil {
			return fmt.Errorf("opaque directory %s: %w: %w", d, err, ErrInvalidImage)
		}
	}
	return nil
}

// applyDir makes rel a directory with src's owner and mode. A directory
// the layer's tar did not list (implicit) keeps what is below it: an
// existing directory keeps its mode, and a symlink to a directory stays
// (the layer's entries go where it leads, inside root).
func applyDir(root *os.Root, src, rel string, implicit bool) error {
	fi, err := root.Lstat(rel)
	switch {
	case err == nil && fi.IsDir():
		if implicit {
			return nil
		}
	case err == nil && implicit && fi.Mode()&fs.ModeSymlink != 0:
		if st, err := root.Stat(rel); err == nil && st.IsDir() {
			return nil
		}
		fallthrough
	case err == nil:
		if err := root.RemoveAll(rel); err != nil {
			return fmt.Errorf("replacing %s: %w", rel, err)
		}
		fallthrough
	case errors.Is(err, fs.ErrNotExist):
		if err := root.Mkdir(rel, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", rel, err)
		}
	default:
		return fmt.Errorf("creating %s: %w: %w", rel, err, ErrInvalidImage)
	}
	sfi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	st := sfi.Sys().(*syscall.Stat_t)
	if err := root.Lchown(rel, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", rel, err)
	}
	if err := root.Chmod(rel, sfi.Mode()&(fs.ModePerm|fs.ModeSticky)); err != nil {
		return fmt.Errorf("chmod %s: %w", rel, err)
	}
	return nil
}

// linkInto replaces rel in root with a hard link to src (a regular file or
// a symlink of the cache), or a copy if copyFile or when root is on
// another filesystem.
func linkInto(root *os.Root, src, rel string, copyFile bool) (copied bool, err error) {
	if _, err := root.Lstat(rel); err == nil {
		if err := root.RemoveAll(rel); err != nil {
			return false, fmt.Errorf("replacing %s: %w", rel, err)
		}
	}
	parent, err := root.Open(path.Dir(rel))
	if err != nil {
		return false, fmt.Errorf("opening the directory of %s: %w: %w", rel, err, ErrInvalidImage)
	}
	defer parent.Close()
	base := path.Base(rel)
	err = unix.EXDEV
	if !copyFile {
		err = unix.Linkat(unix.AT_FDCWD, src, int(parent.Fd()), base, 0)
	}
	if errors.Is(err, unix.EXDEV) {
		copied = true
		err = copyInto(parent, src, base)
	}
	if err != nil {
		return copied, fmt.Errorf("linking %s: %w", rel, err)
	}
	return copied, nil
}

// copyInto copies src (a regular file or symlink) to base in parent.
func copyInto(parent *os.File, src, base string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	pfd := int(parent.Fd())
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(target, pfd, base); err != nil {
			return err
		}
		return unix.Fchownat(pfd, base, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	out := os.NewFile(uintptr(fd), base)
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Chown(int(st.Uid), int(st.Gid))
	}
	if err == nil {
		err = out.Chmod(fi.Mode() & (fs.ModePerm | fs.ModeSticky))
	}
	if err == nil {
		ts := []unix.Timespec{unix.NsecToTimespec(fi.ModTime().UnixNano()), unix.NsecToTimespec(fi.ModTime().UnixNano())}
		err = unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
