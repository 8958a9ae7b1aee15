package contentreg

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// xattrPrefix is the PAX record prefix of an extended attribute (the one
// GNU tar and Go's archive/tar use).
const xattrPrefix = "SCHILY.xattr."

// rootName is the tar name of the tree's root directory.
const rootName = "./"

// writeTree writes the tree dir as a tar to w, in lexical order, parents
// before children, without following any symlink. A hard-linked inode is
// written once and linked to afterwards. Sockets cannot be archived and
// are left out (counted in skipped).
func writeTree(ctx context.Context, dir string, w io.Writer) (skipped int, err error) {
	tw := tar.NewWriter(w)
	seen := map[[2]uint64]string{} // dev, ino of inodes with more links → first name
	buf := make([]byte, 256<<10)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, werr error) error {
		if werr != nil {
			return werr
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		hdr, err := header(p, filepath.ToSlash(rel), &st)
		if err != nil {
			return err
		}
		if hdr == nil {
			skipped++
			return nil
		}
		if hdr.Typeflag != tar.TypeDir && st.Nlink > 1 {
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := seen[key]; ok {
				hdr = &tar.Header{Typeflag: tar.TypeLink, Name: hdr.Name, Linkname: first, Format: tar.FormatPAX}
			} else {
				seen[key] = hdr.Name
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			return copyFile(tw, p, hdr.Size, buf)
		}
		return nil
	})
	if err != nil {
		return skipped, err
	}
	return skipped, tw.Close()
}

// header returns the tar header of the entry at p (named rel in the tree),
// or nil for a socket.
func header(p, rel string, st *unix.Stat_t) (*tar.Header, error) {
	hdr := &tar.Header{
		Name:    rel,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()),
		Format:  tar.FormatPAX,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
		if rel == "." {
			hdr.Name = rootName
		}
	case unix.S_IFREG:
		hdr.Typeflag = tar.TypeReg
		hdr.Size = st.Size
	case unix.S_IFLNK:
		hdr.Typeflag = tar.TypeSymlink
		target, err := os.Readlink(p)
		if err != nil {
			return nil, err
		}
		hdr.Linkname = target
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor = int64(unix.Major(st.Rdev))
		hdr.Devminor = int64(unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	default:
		return nil, nil
	}
	x, err := xattrs(p)
	if err != nil {
		return nil, err
	}
	if len(x) > 0 {
		hdr.PAXRecords = make(map[string]string, len(x))
		for k, v := range x {
			hdr.PAXRecords[xattrPrefix+k] = v
		}
	}
	return hdr, nil
}

// xattrs reads the extended attributes of p (not following a symlink).
func xattrs(p string) (map[string]string, error) {
	names, err := getGrowing(func(b []byte) (int, error) { return unix.Llistxattr(p, b) })
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing the extended attributes of %s: %w", p, err)
	}
	var out map[string]string
	for n := range strings.SplitSeq(string(names), "\x00") {
		if n == "" {
			continue
		}
		v, err := getGrowing(func(b []byte) (int, error) { return unix.Lgetxattr(p, n, b) })
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			return nil, fmt.Errorf("reading extended attribute %s of %s: %w", n, p, err)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[n] = string(v)
	}
	return out, nil
}

// getGrowing calls get with a buffer big enough for its answer.
func getGrowing(get func([]byte) (int, error)) ([]byte, error) {
	for range 8 {
		n, err := get(nil)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		b := make([]byte, n)
		m, err := get(b)
		if errors.Is(err, unix.ERANGE) {
			continue // grew in between
		}
		if err != nil {
			return nil, err
		}
		return b[:m], nil
	}
	return nil, unix.ERANGE
}

// copyFile writes exactly size bytes of the regular file p to w.
func copyFile(w io.Writer, p string, size int64, buf []byte) error {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.CopyBuffer(w, io.LimitReader(onlyReader{f}, size), buf)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if n != size {
		return fmt.Errorf("%s shrank while being read (%d of %d bytes)", p, n, size)
	}
	return nil
}

// onlyReader hides a file's WriterTo/ReaderFrom so that io.CopyBuffer uses
// the buffer given to it.
type onlyReader struct{ io.Reader }

// treeWriter restores a tar written by writeTree into an empty directory.
type treeWriter struct {
	dir   string
	dirs  map[string]bool // directories this archive made ("" is dir)
	files map[string]bool // non-directories this archive made
	times []dirTime       // directories' times, set last
	buf   []byte
}

type dirTime struct {
	p            string
	atime, mtime time.Time
}

// readTree restores the tar r into dir, which must exist and be empty.
// Every entry's parent must be a directory the archive made, so no entry
// can land outside dir (through a symlink or otherwise).
func readTree(ctx context.Context, r io.Reader, dir string) error {
	t := &treeWriter{dir: dir, dirs: map[string]bool{"": true}, files: map[string]bool{}, buf: make([]byte, 256<<10)}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the tree's archive: %w", err)
		}
		if err := t.entry(hdr, tr); err != nil {
			return fmt.Errorf("restoring %q: %w", hdr.Name, err)
		}
	}
	for i := len(t.times) - 1; i >= 0; i-- {
		d := t.times[i]
		if err := setTimes(d.p, d.atime, d.mtime); err != nil {
			return err
		}
	}
	return nil
}

// cleanName returns the entry's path relative to the tree ("" for its
// root), refusing absolute and escaping names.
func cleanName(n string) (string, error) {
	if n == rootName || n == "." {
		return "", nil
	}
	if strings.HasPrefix(n, "/") {
		return "", fmt.Errorf("absolute name")
	}
	c := path.Clean(n)
	if c == "." || c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("name outside the tree")
	}
	return c, nil
}

func (t *treeWriter) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("the root is not a directory")
		}
		return t.meta(t.dir, hdr, true)
	}
	if !t.dirs[path.Dir(rel)] && path.Dir(rel) != "." {
		return fmt.Errorf("parent %q is not a directory of the archive", path.Dir(rel))
	}
	if t.dirs[rel] || t.files[rel] {
		return fmt.Errorf("entry written twice")
	}
	p := filepath.Join(t.dir, filepath.FromSlash(rel))
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
		t.dirs[rel] = true
		return t.meta(p, hdr, true)
	case tar.TypeReg:
		if err := t.writeFile(p, hdr, r); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := os.Symlink(hdr.Linkname, p); err != nil {
			return err
		}
	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		if err != nil || !t.files[target] {
			return fmt.Errorf("hard link to %q, not an earlier file of the archive", hdr.Linkname)
		}
		if err := os.Link(filepath.Join(t.dir, filepath.FromSlash(target)), p); err != nil {
			return err
		}
		t.files[rel] = true
		return nil // the inode's metadata came with its first name
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		mode := uint32(unix.S_IFIFO)
		switch hdr.Typeflag {
		case tar.TypeChar:
			mode = unix.S_IFCHR
		case tar.TypeBlock:
			mode = unix.S_IFBLK
		}
		if err := unix.Mknod(p, mode|0o600, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unsupported entry type %q", hdr.Typeflag)
	}
	t.files[rel] = true
	return t.meta(p, hdr, false)
}

// writeFile creates the regular file p with the entry's content.
func (t *treeWriter) writeFile(p string, hdr *tar.Header, r io.Reader) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.CopyBuffer(f, onlyReader{r}, t.buf); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// meta sets the entry's owner, mode, extended attributes and times on p (a
// directory's times later, once its entries are written), in that order:
// a change of owner clears set-id bits and file capabilities.
func (t *treeWriter) meta(p string, hdr *tar.Header, isDir bool) error {
	if err := unix.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeSymlink {
		if err := unix.Fchmodat(unix.AT_FDCWD, p, uint32(hdr.Mode&0o7777), 0); err != nil {
			return err
		}
	}
	for k, v := range hdr.PAXRecords {
		n, ok := strings.CutPrefix(k, xattrPrefix)
		if !ok {
			continue
		}
		if err := unix.Lsetxattr(p, n, []byte(v), 0); err != nil {
			return fmt.Errorf("extended attribute %s: %w", n, err)
		}
	}
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = hdr.ModTime
	}
	if isDir {
		t.times = append(t.times, dirTime{p: p, atime: atime, mtime: hdr.ModTime})
		return nil
	}
	return setTimes(p, atime, hdr.ModTime)
}

// setTimes sets p's access and modification times, not following a
// symlink.
func setTimes(p string, atime, mtime time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
}
