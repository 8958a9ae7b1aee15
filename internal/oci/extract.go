package oci

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

const (
	metaFile    = "layer.json"
	treeDir     = "tree"
	metaVersion = 1

	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"

	maxPathLen = 4096
)

// layerMeta describes one extracted layer (layer.json).
type layerMeta struct {
	Version int    `json:"version"`
	DiffID  string `json:"diffID"`
	// Opaque are directories whose lower contents the layer hides.
	Opaque []string `json:"opaque,omitempty"`
	// Whiteouts are paths the layer removes from the layers below.
	Whiteouts []string `json:"whiteouts,omitempty"`
	// Implicit are directories the layer's tar did not list (made for
	// the entries inside them): applied, they follow a lower layer's
	// symlink instead of replacing it, and keep a lower directory's mode.
	Implicit []string `json:"implicit,omitempty"`
	// Links are hard links to files of a lower layer: Name -> Target.
	Links []hardLink `json:"links,omitempty"`
	// Dropped counts the device nodes and FIFOs left out.
	Dropped int64 `json:"dropped,omitempty"`
	Bytes   int64 `json:"bytes"`
	Files   int64 `json:"files"`
}

type hardLink struct {
	Name   string `json:"name"`
	Target string `json:"target"`
}

// limits is what is left of one image's budgets.
type limits struct{ bytes, files int64 }

func (l *limits) take(bytes, files int64) error {
	l.bytes -= bytes
	l.files -= files
	if l.bytes < 0 {
		return fmt.Errorf("the image is larger than its size limit: %w", ErrInvalidImage)
	}
	if l.files < 0 {
		return fmt.Errorf("the image has more files than its limit: %w", ErrInvalidImage)
	}
	return nil
}

// extract reads layer l once, checks it against id and installs it in the
// cache, returning its description.
func (c *Cache) extract(ctx context.Context, l v1.Layer, id v1.Hash, budget *limits, p *progress, label string) (layerMeta, error) {
	work := filepath.Join(c.dir, ".tmp-"+randomSuffix())
	if err := os.Mkdir(work, 0o700); err != nil {
		return layerMeta{}, fmt.Errorf("creating layer work dir: %w", err)
	}
	defer os.RemoveAll(work) // after a successful rename, it is gone already
	if err := os.Mkdir(filepath.Join(work, treeDir), 0o755); err != nil {
		return layerMeta{}, err
	}
	rc, err := l.Uncompressed()
	if err != nil {
		return layerMeta{}, fmt.Errorf("fetching: %w", err)
	}
	defer rc.Close()
	h := sha256.New()
	counter := p.counter(label)
	// Every byte of the uncompressed stream counts against the image's
	// size budget: tar headers, the content of entries that are skipped,
	// and whatever follows the end-of-archive marker.
	in := io.TeeReader(&budgetReader{r: &ctxReader{ctx: ctx, r: rc}, budget: budget}, io.MultiWriter(h, counter))
	m, err := untar(ctx, in, filepath.Join(work, treeDir), budget)
	counter.done()
	if err != nil {
		return layerMeta{}, err
	}
	// The rest of the stream is part of the digest; reading to the end
	// also makes the compressed stream verify its own digest. Only zero
	// padding may follow the end marker.
	if err := readPadding(in); err != nil {
		return layerMeta{}, err
	}
	if err := rc.Close(); err != nil {
		return layerMeta{}, fmt.Errorf("reading: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != id.Hex {
		return layerMeta{}, fmt.Errorf("content has digest sha256:%s, not its diff_id: %w", got, ErrInvalidImage)
	}
	m.Version, m.DiffID = metaVersion, id.String()
	b, err := json.Marshal(m)
	if err != nil {
		return layerMeta{}, err
	}
	if err := os.WriteFile(filepath.Join(work, metaFile), b, 0o600); err != nil {
		return layerMeta{}, fmt.Errorf("writing %s: %w", metaFile, err)
	}
	final := c.layerDir(id)
	err = unix.Renameat2(unix.AT_FDCWD, work, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		if cm, ok, _ := c.readMeta(id); ok {
			return cm, nil // extracted meanwhile by another unpack
		}
		// A layer directory without a valid description: replace it.
		err = unix.Renameat2(unix.AT_FDCWD, work, unix.AT_FDCWD, final, unix.RENAME_EXCHANGE)
	}
	if err != nil {
		return layerMeta{}, fmt.Errorf("installing layer: %w", err)
	}
	return m, nil
}

// budgetReader takes every byte it reads from the image's size budget
// and fails once the budget is spent.
type budgetReader struct {
	r      io.Reader
	budget *limits
}

func (b *budgetReader) Read(p []byte) (int, error) {
	// Never read more than the budget has left, plus one byte to notice
	// that it is exceeded.
	if left := b.budget.bytes + 1; left <= 0 {
		return 0, b.budget.take(1, 0)
	} else if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := b.r.Read(p)
	if terr := b.budget.take(int64(n), 0); terr != nil {
		return n, terr
	}
	return n, err
}

// readPadding reads what follows a layer's end-of-archive marker to the
// end of the stream, and fails at the first byte that is not zero
// padding: data there is never extracted, so it is not read either.
func readPadding(r io.Reader) error {
	buf := make([]byte, 32<<10)
	var off int64
	for {
		n, err := r.Read(buf)
		for i, c := range buf[:n] {
			if c != 0 {
				return fmt.Errorf("byte %d after the tar end marker is data, not zero padding: %w", off+int64(i), ErrInvalidImage)
			}
		}
		off += int64(n)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading: %w", err)
		}
	}
}

// ctxReader stops reading once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r *ctxReader) Read(b []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(b)
}

// cleanName turns a tar entry name into a path relative to the layer's
// root, or fails if it climbs out.
func cleanName(n string) (string, error) {
	if len(n) > maxPathLen || strings.IndexByte(n, 0) >= 0 {
		return "", fmt.Errorf("entry name of %d bytes: %w", len(n), ErrInvalidImage)
	}
	c := path.Clean("/" + n)
	// Clean("/"+n) drops ".." above the root silently; refuse it instead.
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", fmt.Errorf("entry %q climbs out of the root with \"..\": %w", n, ErrInvalidImage)
		}
	}
	if c == "/" {
		return ".", nil
	}
	return c[1:], nil
}

// untar extracts a layer's tar stream into dir (an empty directory):
// regular files, directories, symlinks and hard links, owners kept,
// set-id bits cleared, devices, FIFOs and xattrs dropped; whiteouts and
// opaque markers are recorded, not extracted. Every path is resolved
// inside dir.
func untar(ctx context.Context, r io.Reader, dir string, budget *limits) (layerMeta, error) {
	var m layerMeta
	root, err := os.OpenRoot(dir)
	if err != nil {
		return m, err
	}
	defer root.Close()
	dirs := map[string]bool{".": true} // known directories
	implicit := map[string]bool{}
	tr := tar.NewReader(r)
	buf := make([]byte, 256<<10)
	for {
		if err := ctx.Err(); err != nil {
			return m, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return m, fmt.Errorf("reading tar: %w: %w", err, ErrInvalidImage)
		}
		name, err := cleanName(hdr.Name)
		if err != nil {
			return m, err
		}
		if err := takeEntry(hdr, budget); err != nil {
			return m, err
		}
		m.Files++
		base, parent := path.Base(name), path.Dir(name)
		if strings.HasPrefix(base, whiteoutPrefix) {
			if err := m.whiteout(hdr.Name, base, parent); err != nil {
				return m, err
			}
			continue
		}
		if name != "." {
			if err := mkdirs(root, parent, dirs, implicit); err != nil {
				return m, err
			}
		}
		mode := fs.FileMode(hdr.Mode & 0o777)
		if hdr.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := untarDir(root, name, hdr, mode, dirs, implicit); err != nil {
				return m, err
			}
		case tar.TypeReg: // the reader turns TypeRegA into TypeReg or TypeDir
			if err := replace(root, name, dirs); err != nil {
				return m, err
			}
			if err := writeFile(root, name, hdr, mode, tr, buf); err != nil {
				return m, err
			}
			m.Bytes += hdr.Size
		case tar.TypeSymlink:
			if err := untarSymlink(root, name, hdr, dirs); err != nil {
				return m, err
			}
		case tar.TypeLink:
			if err := m.untarLink(root, name, hdr, dirs); err != nil {
				return m, err
			}
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			m.Dropped++
		case tar.TypeXGlobalHeader:
		default:
			return m, fmt.Errorf("entry %s has unsupported type %q: %w", name, hdr.Typeflag, ErrInvalidImage)
		}
	}
	for d := range implicit {
		m.Implicit = append(m.Implicit, d)
	}
	return m, nil
}

// takeEntry takes one file from the budget for hdr. The content itself is
// taken from the budget as it is read (budgetReader); a size above what
// is left fails before.
func takeEntry(hdr *tar.Header, budget *limits) error {
	if hdr.Size > budget.bytes {
		return budget.take(hdr.Size, 0)
	}
	return budget.take(0, 1)
}

// whiteout records the whiteout entry hdrName (base in directory parent):
// an opaque directory, or a path the layer removes; other AUFS metadata
// is ignored.
func (m *layerMeta) whiteout(hdrName, base, parent string) error {
	switch {
	case base == opaqueMarker:
		m.Opaque = append(m.Opaque, parent)
	case strings.HasPrefix(base, whiteoutPrefix+whiteoutPrefix):
		// Other AUFS metadata (.wh..wh.plnk): ignored.
	default:
		w := path.Join(parent, strings.TrimPrefix(base, whiteoutPrefix))
		if _, err := cleanName(w); err != nil || w == parent {
			return fmt.Errorf("whiteout %q: %w", hdrName, ErrInvalidImage)
		}
		m.Whiteouts = append(m.Whiteouts, w)
	}
	return nil
}

// untarDir makes directory name (in place of a non-directory there), no
// longer implicit, with hdr's owner and mode.
func untarDir(root *os.Root, name string, hdr *tar.Header, mode fs.FileMode, dirs, implicit map[string]bool) error {
	if name != "." {
		if fi, err := root.Lstat(name); err == nil && !fi.IsDir() {
			if err := root.Remove(name); err != nil {
				return err
			}
		}
		if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating %s: %w", name, err)
		}
	}
	dirs[name] = true
	delete(implicit, name)
	if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown %s: %w", name, err)
	}
	if err := root.Chmod(name, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", name, err)
	}
	return nil
}

// untarSymlink makes symlink name to hdr's target, with hdr's owner.
func untarSymlink(root *os.Root, name string, hdr *tar.Header, dirs map[string]bool) error {
	if len(hdr.Linkname) > maxPathLen || strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return fmt.Errorf("symlink %s: target of %d bytes: %w", name, len(hdr.Linkname), ErrInvalidImage)
	}
	if err := replace(root, name, dirs); err != nil {
		return err
	}
	// The target is data: it is stored as is and never followed
	// here (every path is resolved inside root).
	if err := root.Symlink(hdr.Linkname, name); err != nil {
		return fmt.Errorf("symlink %s: %w", name, err)
	}
	if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown %s: %w", name, err)
	}
	return nil
}

// untarLink makes hard link name to a file of this layer, or records it
// to be linked when the layer is applied when its target is in a lower
// layer; a link to a directory, to itself or out of the layer is refused.
func (m *layerMeta) untarLink(root *os.Root, name string, hdr *tar.Header, dirs map[string]bool) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link %s: %w", name, err)
	}
	if target == name || target == "." {
		return fmt.Errorf("hard link %s to %q: %w", name, hdr.Linkname, ErrInvalidImage)
	}
	if err := replace(root, name, dirs); err != nil {
		return err
	}
	fi, err := root.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// A file of a lower layer: linked when applied.
		m.Links = append(m.Links, hardLink{Name: name, Target: target})
	case err != nil:
		return fmt.Errorf("hard link %s to %s: %w: %w", name, target, err, ErrInvalidImage)
	case fi.IsDir():
		return fmt.Errorf("hard link %s to directory %s: %w", name, target, ErrInvalidImage)
	default:
		if err := root.Link(target, name); err != nil {
			return fmt.Errorf("hard link %s to %s: %w: %w", name, target, err, ErrInvalidImage)
		}
	}
	return nil
}

// mkdirs makes the directories of p that do not exist (each one recorded
// as implicit), resolving inside root.
func mkdirs(root *os.Root, p string, dirs, implicit map[string]bool) error {
	if dirs[p] {
		return nil
	}
	if p != "." {
		if err := mkdirs(root, path.Dir(p), dirs, implicit); err != nil {
			return err
		}
	}
	fi, err := root.Stat(p) // a symlink of this layer to a directory of it is followed
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if fi2, err := root.Lstat(p); err == nil && !fi2.IsDir() {
			// A dangling symlink or a file: the entry needs a directory.
			if err := root.Remove(p); err != nil {
				return err
			}
		}
		if err := root.Mkdir(p, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", p, err)
		}
		implicit[p] = true
	case err != nil:
		return fmt.Errorf("creating %s: %w: %w", p, err, ErrInvalidImage)
	case !fi.IsDir():
		if err := root.Remove(p); err != nil {
			return err
		}
		if err := root.Mkdir(p, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", p, err)
		}
		implicit[p] = true
	}
	dirs[p] = true
	return nil
}

// replace removes what is at name, as a later entry of the same path does.
func replace(root *os.Root, name string, dirs map[string]bool) error {
	if name == "." {
		return fmt.Errorf("entry for the root that is not a directory: %w", ErrInvalidImage)
	}
	if _, err := root.Lstat(name); err == nil {
		if err := root.RemoveAll(name); err != nil {
			return fmt.Errorf("replacing %s: %w", name, err)
		}
		for d := range dirs {
			if d == name || strings.HasPrefix(d, name+"/") {
				delete(dirs, d)
			}
		}
	}
	return nil
}

// writeFile creates name with the entry's content, owner, mode and mtime.
func writeFile(root *os.Root, name string, hdr *tar.Header, mode fs.FileMode, r io.Reader, buf []byte) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	n, err := io.CopyBuffer(f, io.LimitReader(r, hdr.Size), buf)
	if err == nil && n != hdr.Size {
		err = fmt.Errorf("short content (%d of %d bytes): %w", n, hdr.Size, ErrInvalidImage)
	}
	if err == nil {
		err = f.Chown(hdr.Uid, hdr.Gid)
	}
	if err == nil {
		err = f.Chmod(mode) // after chown, which may clear set-id bits anyway
	}
	if err == nil && !hdr.ModTime.IsZero() {
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		err = unix.UtimesNanoAt(int(f.Fd()), "", ts, unix.AT_EMPTY_PATH)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return nil
}

// progress writes progress lines; on a terminal it also shows a live byte
// count while a layer is read.
type progress struct {
	w   io.Writer
	tty bool
}

func newProgress(w io.Writer) *progress {
	if w == nil {
		w = io.Discard
	}
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.tty = err == nil
	}
	return p
}

func (p *progress) linef(format string, a ...any) {
	fmt.Fprintf(p.w, format+"\n", a...)
}

// counter returns a writer that counts the bytes of one layer.
func (p *progress) counter(label string) *byteCounter {
	return &byteCounter{p: p, label: label, start: time.Now()}
}

type byteCounter struct {
	p     *progress
	label string
	n     int64
	start time.Time
	last  time.Time
	shown bool
}

func (c *byteCounter) Write(b []byte) (int, error) {
	c.n += int64(len(b))
	if c.p.tty && time.Since(c.last) > 200*time.Millisecond {
		c.last = time.Now()
		c.shown = true
		fmt.Fprintf(c.p.w, "\r\x1b[K%s: %s (%s)", c.label, humanSize(c.n), time.Since(c.start).Round(100*time.Millisecond))
	}
	return len(b), nil
}

func (c *byteCounter) done() {
	if c.shown {
		fmt.Fprint(c.p.w, "\r\x1b[K")
	}
}
