package content

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// CloneTree makes dst (which must not exist) a copy of src in which every
// non-directory is a hard link to src's (a copy where a link cannot be
// made: another filesystem, too many links). Nothing is followed.
func CloneTree(ctx context.Context, src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if d.IsDir() {
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			if st != nil {
				if err := os.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
					return err
				}
				if err := unix.Chmod(target, st.Mode&0o7777); err != nil {
					return err
				}
			}
			return nil
		}
		err = os.Link(p, target)
		if err == nil || !(errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EMLINK)) {
			return err
		}
		return copyEntry(p, target, fi)
	})
}

// copyEntry copies one non-directory without following it.
func copyEntry(src, dst string, fi fs.FileInfo) error {
	st := fi.Sys().(*syscall.Stat_t)
	switch fi.Mode().Type() {
	case fs.ModeSymlink:
		t, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(t, dst); err != nil {
			return err
		}
	case 0:
		in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return err
		}
	default:
		return nil // fifos, sockets, devices are not kept
	}
	return os.Lchown(dst, int(st.Uid), int(st.Gid))
}

// unshift maps a host uid or gid of a sandbox's writable layer back to the
// sandbox's own (the native backend maps sandbox ids 0..65535 to a host
// range from 1<<24 up, 65536 per slot).
func unshift(id int) int {
	if id >= 1<<24 {
		return (id - 1<<24) % 65536
	}
	return id
}

// ApplyLayer applies a sandbox's writable layer, as
// isolation.LayerReader.ExportLayer writes it (the tar at layerPath), to
// the tree root: deletions and opaque directories first, then every entry,
// each replacing what was there (a file is always made anew, never written
// in place: the tree's files are hard links shared with other trees).
// Paths are resolved from root's descriptor without following any
// symlink, so a link made by a build step never leads outside the tree.
func ApplyLayer(ctx context.Context, root, layerPath string) error {
	rootFD, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening layer tree: %w", err)
	}
	defer unix.Close(rootFD)
	f, err := os.Open(layerPath)
	if err != nil {
		return err
	}
	defer f.Close()
	// Pass 1: the whiteout list (the archive's last entry).
	deleted, opaque, err := readWhiteouts(f)
	if err != nil {
		return err
	}
	for _, p := range deleted {
		if err := removeAt(rootFD, CleanRel(p)); err != nil {
			return fmt.Errorf("applying deletion of %s: %w", p, err)
		}
	}
	for _, p := range opaque {
		rel := CleanRel(strings.TrimSuffix(p, "/"))
		if rel == "" {
			continue
		}
		if err := emptyAt(rootFD, rel); err != nil {
			return fmt.Errorf("applying opaque directory %s: %w", p, err)
		}
	}
	// Pass 2: the entries.
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return applyEntries(ctx, rootFD, f)
}

// readWhiteouts reads the layer's whiteout list (changes/.whiteouts): the
// paths deleted and the directories made opaque.
func readWhiteouts(f io.Reader) (deleted, opaque []string, err error) {
	tr := tar.NewReader(bufio.NewReader(f))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return deleted, opaque, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("reading layer: %w", err)
		}
		if hdr.Name != "changes/.whiteouts" {
			continue
		}
		sc := bufio.NewScanner(tr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if strings.HasPrefix(line, "\"") {
				uq, err := strconv.Unquote(strings.TrimSuffix(line, " opaque"))
				if err != nil {
					continue
				}
				if strings.HasSuffix(line, " opaque") {
					opaque = append(opaque, uq)
				} else {
					deleted = append(deleted, uq)
				}
				continue
			}
			if p, ok := strings.CutSuffix(line, "/ opaque"); ok {
				opaque = append(opaque, p)
			} else {
				deleted = append(deleted, line)
			}
		}
		if err := sc.Err(); err != nil {
			return nil, nil, fmt.Errorf("reading layer whiteouts: %w", err)
		}
	}
}

// applyEntries applies every entry under changes/ of the layer read from
// f to the tree rootFD.
func applyEntries(ctx context.Context, rootFD int, f io.Reader) error {
	tr := tar.NewReader(bufio.NewReader(f))
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading layer: %w", err)
		}
		name, ok := strings.CutPrefix(hdr.Name, "changes/")
		if !ok || name == ".whiteouts" {
			continue
		}
		rel := CleanRel(name)
		if rel == "" {
			continue
		}
		if err := applyEntry(rootFD, rel, hdr, tr); err != nil {
			return fmt.Errorf("applying %s: %w", rel, err)
		}
	}
}

// CleanRel makes p a clean relative path ("" for the root); ".." cannot
// survive path.Clean of an absolute path.
func CleanRel(p string) string {
	return strings.TrimPrefix(path.Clean("/"+p), "/")
}

// openParent opens the directory holding rel, beneath root, with no
// symlink followed; it returns the descriptor and rel's last element.
func openParent(root int, rel string) (int, string, error) {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	fd, err := unix.Openat2(root, dir, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
	if err != nil {
		return -1, "", fmt.Errorf("opening %s: %w", dir, err)
	}
	return fd, base, nil
}

func applyEntry(root int, rel string, hdr *tar.Header, r io.Reader) error {
	dfd, base, err := openParent(root, rel)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	uid, gid := unshift(hdr.Uid), unshift(hdr.Gid)
	mode := uint32(hdr.Mode) & 0o7777
	var st unix.Stat_t
	exists := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	isDir := exists && st.Mode&unix.S_IFMT == unix.S_IFDIR
	if exists && !(isDir && hdr.Typeflag == tar.TypeDir) {
		if err := removeEntryAt(dfd, base); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if !isDir {
			if err := unix.Mkdirat(dfd, base, 0o700); err != nil {
				return err
			}
		}
		if err := unix.Fchownat(dfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return unix.Fchmodat(dfd, base, mode, 0)
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, dfd, base); err != nil {
			return err
		}
		return unix.Fchownat(dfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
	case tar.TypeFifo:
		if err := unix.Mkfifoat(dfd, base, 0o600); err != nil {
			return err
		}
		if err := unix.Fchownat(dfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return unix.Fchmodat(dfd, base, mode, 0)
	case tar.TypeReg:
		// Set-id bits are cleared, as internal/oci does for images: they
		// do nothing in a sandbox (no_new_privs, nosuid), and a file a
		// build step made set-uid root must do nothing on the host either.
		mode &^= unix.S_ISUID | unix.S_ISGID
		fd, err := unix.Openat(dfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		out := os.NewFile(uintptr(fd), base)
		if _, err := io.Copy(out, io.LimitReader(r, hdr.Size)); err != nil {
			out.Close()
			return err
		}
		// Owner first: chown clears the set-id bits chmod then sets.
		if err := unix.Fchown(fd, uid, gid); err != nil {
			out.Close()
			return err
		}
		if err := unix.Fchmod(fd, mode); err != nil {
			out.Close()
			return err
		}
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(dfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
		return out.Close()
	}
	return nil
}

// removeAt removes rel beneath root, recursively, following nothing. A
// missing path is not an error.
func removeAt(root int, rel string) error {
	if rel == "" {
		return nil
	}
	dfd, base, err := openParent(root, rel)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	return removeEntryAt(dfd, base)
}

// emptyAt removes the contents of directory rel beneath root.
func emptyAt(root int, rel string) error {
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return nil // replaced by the layer's own entry in pass 2
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return emptyDirFD(fd)
}

func emptyDirFD(fd int) error {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(dup), "dir")
	defer d.Close()
	for {
		names, err := d.Readdirnames(512)
		if errors.Is(err, io.EOF) || len(names) == 0 {
			return nil
		}
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := removeEntryAt(fd, n); err != nil {
				return err
			}
		}
	}
}

// removeEntryAt removes name in directory dfd, recursively.
func removeEntryAt(dfd int, name string) error {
	err := unix.Unlinkat(dfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	sub, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	err = emptyDirFD(sub)
	unix.Close(sub)
	if err != nil {
		return err
	}
	return unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
}
