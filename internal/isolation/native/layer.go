package native

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencesandbox/fence/internal/forensics"
	"github.com/fencesandbox/fence/internal/isolation"
	"golang.org/x/sys/unix"
)

var _ isolation.LayerReader = (*sandbox)(nil)

// maxLayerDepth bounds the directory nesting an export walks.
const maxLayerDepth = 256

// ExportLayer implements isolation.LayerReader: it writes the writable
// layer's files as an uncompressed tar under changes/, walking the layer
// through descriptors (openat with O_NOFOLLOW from the layer's root): a
// symlink is written as a symlink and never followed, a whiteout is
// listed in changes/.whiteouts, and more than limit bytes (headers
// included) is ErrTooLarge. It works while the sandbox runs, paused or
// not (files being written read as they are at that moment).
func (s *sandbox) ExportLayer(ctx context.Context, w io.Writer, limit int64) error {
	fd, err := s.openUpper()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return writeLayer(ctx, fd, w, limit, nil, false)
}

// LayerSize implements isolation.LayerReader.
func (s *sandbox) LayerSize(ctx context.Context) (int64, error) {
	fd, err := s.openUpper()
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	lw := newLayerWriter(ctx, nil, math.MaxInt64)
	if err := lw.dir(fd, "", 0); err != nil {
		return 0, err
	}
	return math.MaxInt64 - lw.left + int64(lw.whiteouts.Len()) + 512, nil
}

// openUpper opens the overlay's upper directory: through the layer's
// descriptor once the host mount is detached, else by its path, with no
// symlink followed either way.
func (s *sandbox) openUpper() (int, error) {
	s.layerMu.RLock()
	defer s.layerMu.RUnlock()
	if s.layerGone {
		return -1, fmt.Errorf("sandbox %s: its layer is released: %w", s.id, isolation.ErrNotFound)
	}
	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV}
	var fd int
	var err error
	if s.diskFD >= 0 {
		fd, err = unix.Openat2(s.diskFD, "upper", how)
	} else {
		fd, err = unix.Openat2(unix.AT_FDCWD, filepath.Join(s.b.sbDir, s.key, "disk", "upper"), &unix.OpenHow{Flags: how.Flags, Resolve: unix.RESOLVE_NO_SYMLINKS})
	}
	if err != nil {
		return -1, fmt.Errorf("opening the writable layer of %s: %w", s.id, err)
	}
	return fd, nil
}

// archiveTimeout bounds archiving one killed sandbox's layer.
const archiveTimeout = 2 * time.Minute

// archiveLayer keeps the layer of a killed sandbox in the backend's
// forensics archive, if it has one: called by Kill's background release
// once no process of the sandbox runs, before the layer goes, with its own
// time budget (the release's is left whole).
func (s *sandbox) archiveLayer() {
	a := s.b.opts.Forensics
	if a == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), archiveTimeout)
	defer cancel()
	fd, err := s.openUpper()
	if err != nil {
		s.b.log.Warn("archiving a killed sandbox's layer", "sandbox_id", s.id, "err", err)
		return
	}
	defer unix.Close(fd)
	// What fence wrote at create and the sandbox left alone (resolver,
	// hosts, sudo, the CA bundle: a few hundred KiB to compress at every
	// kill) is not evidence of anything the sandbox did.
	// A file larger than what the cap has left is listed, not kept, so that
	// one huge (or sparse) file cannot keep the rest of a killed sandbox's
	// changes out of its archive.
	if err := a.Put(s.id, func(w io.Writer) error { return writeLayer(ctx, fd, w, a.Cap(), s.installed, true) }); err != nil {
		s.b.log.Warn("archiving a killed sandbox's layer", "sandbox_id", s.id, "err", err)
	}
}

type layerWriter struct {
	ctx       context.Context
	tw        *tar.Writer
	left      int64
	whiteouts bytes.Buffer
	// skip names the files ("/etc/hosts") to leave out while their ctime
	// is the one given: a ctime no process can set, any change to the
	// file (content, mode, owner, times) moves it to the present.
	skip map[string]unix.Timespec
	// listOversize lists in changes/.whiteouts, instead of failing with
	// ErrTooLarge, a regular file whose contents do not fit in what is
	// left (headers still count against the limit).
	listOversize bool
}

// listReserve is what the limit keeps for the headers and the list that
// follow a file left out as too large.
const listReserve = 1 << 20

// newLayerWriter writes to tw, or only counts when tw is nil.
func newLayerWriter(ctx context.Context, tw *tar.Writer, limit int64) *layerWriter {
	lw := &layerWriter{ctx: ctx, tw: tw, left: limit}
	lw.whiteouts.WriteString("# paths deleted (whiteouts) or made opaque in this sandbox, against its template\n")
	return lw
}

func writeLayer(ctx context.Context, root int, w io.Writer, limit int64, skip map[string]unix.Timespec, listOversize bool) error {
	lw := newLayerWriter(ctx, tar.NewWriter(w), limit)
	lw.skip, lw.listOversize = skip, listOversize
	if err := lw.dir(root, "", 0); err != nil {
		return err
	}
	if err := lw.charge(int64(lw.whiteouts.Len()) + 512); err != nil {
		return err
	}
	if err := lw.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "changes/.whiteouts", Mode: 0o644,
		Size: int64(lw.whiteouts.Len()), ModTime: time.Now()}); err != nil {
		return err
	}
	if _, err := lw.tw.Write(lw.whiteouts.Bytes()); err != nil {
		return err
	}
	return lw.tw.Close()
}

// header writes hdr, unless only counting.
func (lw *layerWriter) header(hdr *tar.Header) error {
	if lw.tw == nil {
		return nil
	}
	return lw.tw.WriteHeader(hdr)
}

func (lw *layerWriter) charge(n int64) error {
	if n > lw.left {
		return fmt.Errorf("%w (%d bytes)", forensics.ErrTooLarge, lw.left)
	}
	lw.left -= n
	return nil
}

// quote writes a path as is unless it holds a newline or another control
// character: then Go-quoted.
func quote(p string) string {
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return strconv.Quote(p)
		}
	}
	return p
}

// dir writes the entries of the directory fd (the layer's path rel).
// Its names are read a batch at a time (memory stays bounded however
// many a directory holds), sorted within each batch.
func (lw *layerWriter) dir(fd int, rel string, depth int) error {
	if depth > maxLayerDepth {
		lw.whiteouts.WriteString("# not exported: /" + quote(rel) + " (nested deeper than " + strconv.Itoa(maxLayerDepth) + " directories)\n")
		return nil
	}
	return walkDir(lw.ctx, fd, rel, func(name string) error {
		if rel == "" && name == ".whiteouts" {
			lw.whiteouts.WriteString("# /.whiteouts of the sandbox itself is not exported (the name is this list's)\n")
			return nil
		}
		return lw.entry(fd, rel, name, depth)
	})
}

// walkDir calls fn with each name in the directory fd (the layer's path
// rel), read a batch at a time (memory stays bounded however many names
// a directory holds) and sorted within each batch, checking ctx between
// batches. The names are read through a duplicate of fd (os.File owns and
// closes it); fn opens what it needs relative to fd.
func walkDir(ctx context.Context, fd int, rel string, fn func(name string) error) error {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("reading layer directory /%s: %w", rel, err)
	}
	f := os.NewFile(uintptr(dup), rel)
	defer f.Close()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		names, err := f.Readdirnames(1024)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading layer directory /%s: %w", rel, err)
		}
		slices.Sort(names)
		for _, name := range names {
			if err := fn(name); err != nil {
				return err
			}
		}
	}
}

func (lw *layerWriter) entry(dirfd int, rel, name string, depth int) error {
	p := rel + name
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // gone meanwhile
		}
		return fmt.Errorf("reading layer entry /%s: %w", p, err)
	}
	if t, ok := lw.skip["/"+p]; ok && st.Ctim == t && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	if err := lw.charge(1024); err != nil { // a header, and a long name's
		return err
	}
	hdr := &tar.Header{Name: "changes/" + p, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix())}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			lw.whiteouts.WriteString("/" + quote(p) + "\n")
		}
		return nil // device nodes are never exported
	case unix.S_IFDIR:
		sub, opaque, err := openLayerDir(dirfd, name, p)
		if err != nil || sub < 0 {
			return err
		}
		defer unix.Close(sub)
		if opaque {
			lw.whiteouts.WriteString("/" + quote(p) + "/ opaque\n")
		}
		hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		if err := lw.header(hdr); err != nil {
			return err
		}
		return lw.dir(sub, p+"/", depth+1)
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("reading layer symlink /%s: %w", p, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, string(buf[:n])
		return lw.header(hdr)
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
		return lw.header(hdr)
	case unix.S_IFREG:
		if lw.tw == nil { // counting only
			return lw.charge(st.Size)
		}
		return lw.file(dirfd, name, hdr)
	default:
		return nil // sockets, block devices: nothing to keep
	}
}

// file writes one regular file, opened without following a symlink and
// checked to be the regular file stat saw.
func (lw *layerWriter) file(dirfd int, name string, hdr *tar.Header) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
			return nil // gone, or replaced by a symlink, meanwhile
		}
		return fmt.Errorf("opening layer file %s: %w", hdr.Name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("reading layer file %s: %w", hdr.Name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	if lw.listOversize && st.Size > lw.left-listReserve {
		lw.whiteouts.WriteString(fmt.Sprintf("# not kept: /%s (%d bytes, %d allocated): more than the archive's cap had left\n",
			quote(strings.TrimPrefix(hdr.Name, "changes/")), st.Size, st.Blocks*512))
		return nil
	}
	if err := lw.charge(st.Size); err != nil {
		return err
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
	if err := lw.tw.WriteHeader(hdr); err != nil {
		return err
	}
	// Holes are written as zeros without being read; the context is
	// checked between chunks.
	sw := &seqWriter{w: lw.tw}
	r := &sparseReader{ctx: lw.ctx, f: f, fd: fd, size: st.Size}
	if _, err := r.read(nil, sw); err != nil {
		return fmt.Errorf("reading layer file %s: %w", hdr.Name, err)
	}
	// A file that shrank while read is padded to the size in its header.
	return sw.pad(st.Size)
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// openLayerDir opens the directory name in dirfd, a directory of a
// writable layer at /p, for a walk of it, and reports whether overlayfs
// marks it opaque (trusted.overlay.opaque, or user.overlay.opaque for a
// userxattr mount). A directory gone meanwhile gives -1 and no error.
func openLayerDir(dirfd int, name, p string) (fd int, opaque bool, err error) {
	fd, err = unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return -1, false, nil
		}
		return -1, false, fmt.Errorf("opening layer directory /%s: %w", p, err)
	}
	buf := make([]byte, 8)
	for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if n, err := unix.Fgetxattr(fd, attr, buf); err == nil && n == 1 && buf[0] == 'y' {
			return fd, true, nil
		}
	}
	return fd, false, nil
}
