package native

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/forensics"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/testutil"
)

// hugeSize is the apparent size of the sparse files made here: 16 TiB
// less a block, the largest file ext4 with 4 KiB blocks takes (what a
// sandbox's writable layer is), or 1 TiB where the test's filesystem
// takes less.
func hugeFile(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int64{16<<40 - 4096, 1 << 40} {
		if err := f.Truncate(size); err == nil {
			return size
		}
	}
	t.Skipf("the filesystem of %s takes no 1 TiB sparse file", path)
	return 0
}

func writeAt(t *testing.T, path string, data string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(data), off); err != nil {
		t.Fatal(err)
	}
}

// listDir lists dir as Checkpointer.Changes lists a writable layer.
func listDir(t *testing.T, ctx context.Context, dir string) (map[string]isolation.FileChange, error) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	c := &layerCopy{ctx: ctx, left: 1 << 62}
	if err := c.dir(fd, -1, -1, "", 0); err != nil {
		return nil, err
	}
	out := map[string]isolation.FileChange{}
	for _, e := range c.entries {
		out[e.Path] = e
	}
	return out, nil
}

// TestListSparseFiles: a layer's listing reads a file with holes by its
// data (a 16 TiB file with two blocks of data is listed; read byte by
// byte it would take hours), and its hash holds the hole map: the same
// bytes with a hole or with written zeros, or the same data at another
// offset, hash differently; a file without holes hashes as sha256sum.
func TestListSparseFiles(t *testing.T) {
	dir := t.TempDir()
	huge := hugeFile(t, filepath.Join(dir, "huge"))
	writeAt(t, filepath.Join(dir, "huge"), "data", 1<<30)
	hugeFile(t, filepath.Join(dir, "moved"))
	writeAt(t, filepath.Join(dir, "moved"), "data", 2<<30)
	// The same 8 KiB: a hole then a block, or zeros then the block.
	writeAt(t, filepath.Join(dir, "holey"), "block", 4096)
	writeAt(t, filepath.Join(dir, "zeros"), string(make([]byte, 4096))+"block", 0)
	writeAt(t, filepath.Join(dir, "dense"), "dense", 0)
	if err := os.WriteFile(filepath.Join(dir, "empty"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	writeAt(t, filepath.Join(dir, "hole"), "", 0)
	if err := os.Truncate(filepath.Join(dir, "hole"), 8192); err != nil {
		t.Fatal(err)
	}
	es, err := listDir(t, t.Context(), dir)
	if err != nil {
		t.Fatalf("listing: %v", err)
	}
	if got := es["/huge"]; got.Size != huge || got.SHA256 == "" {
		t.Errorf("/huge = %+v, want size %d and a hash", got, huge)
	}
	if es["/huge"].SHA256 == es["/moved"].SHA256 {
		t.Errorf("/huge and /moved (the same data at another offset) hash the same")
	}
	if es["/holey"].SHA256 == es["/zeros"].SHA256 {
		t.Errorf("/holey and /zeros (the same bytes, a hole against written zeros) hash the same: %s", es["/holey"].SHA256)
	}
	if es["/hole"].SHA256 == es["/empty"].SHA256 || es["/hole"].SHA256 == "" {
		t.Errorf("/hole (8 KiB of hole) hashes %q, /empty %q", es["/hole"].SHA256, es["/empty"].SHA256)
	}
	for name, content := range map[string]string{"/dense": "dense", "/zeros": string(make([]byte, 4096)) + "block", "/empty": ""} {
		sum := sha256.Sum256([]byte(content))
		if got, want := es[name].SHA256, hex.EncodeToString(sum[:]); got != want {
			t.Errorf("%s hashes %s, want its bytes' SHA-256 %s", name, got, want)
		}
	}
}

// TestCopySparseFile: a checkpoint's copy of a file with holes keeps the
// holes, is charged its data (a 16 TiB file with a block of data fits a
// budget of 1 MiB) and hashes as the original; the copy reads the same.
func TestCopySparseFile(t *testing.T) {
	testutil.RequireRoot(t) // the copy sets owners
	src, dst := t.TempDir(), t.TempDir()
	huge := hugeFile(t, filepath.Join(src, "huge"))
	writeAt(t, filepath.Join(src, "huge"), "data", 1<<30)
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sfd)
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	c := &layerCopy{ctx: t.Context(), left: 1 << 20, mtimes: map[string]unix.Timespec{}}
	if err := c.dir(sfd, dfd, -1, "", 0); err != nil {
		t.Fatalf("copying a layer with a %d-byte sparse file in a 1 MiB budget: %v", huge, err)
	}
	if c.bytes > 1<<20 {
		t.Errorf("the copy was charged %d bytes", c.bytes)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "huge"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != huge || st.Blocks*512 > 1<<20 {
		t.Errorf("the copy: size %d, %d bytes allocated; want %d and a few blocks", st.Size, st.Blocks*512, huge)
	}
	f, err := os.Open(filepath.Join(dst, "huge"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 6)
	if _, err := f.ReadAt(buf, 1<<30-1); err != nil || string(buf) != "\x00data\x00" {
		t.Errorf("the copy reads %q at 1 GiB, %v", buf, err)
	}
	copied, err := listDir(t, t.Context(), dst)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.entries) != 1 || copied["/huge"].SHA256 != c.entries[0].SHA256 {
		t.Errorf("the copy hashes %q, the original %+v", copied["/huge"].SHA256, c.entries)
	}
}

// countdownCtx is a context whose Err is nil for its first n calls and
// context.Canceled from then on: it is cancelled in the middle of
// whatever checks it, at a point that does not depend on timing.
type countdownCtx struct {
	context.Context
	n     int64
	calls atomic.Int64
}

func (c *countdownCtx) Err() error {
	if c.calls.Add(1) > c.n {
		return context.Canceled
	}
	return nil
}

// TestListCancelledMidFile: a cancelled context stops the hashing in the
// middle of a file, dense or with holes (64 MiB of data is 256 chunks;
// the context is cancelled at its fourth check).
func TestListCancelledMidFile(t *testing.T) {
	for _, tt := range []struct {
		name string
		make func(t *testing.T, path string)
	}{
		{"dense", func(t *testing.T, path string) {
			writeAt(t, path, string(make([]byte, 64<<20)), 0)
		}},
		{"sparse", func(t *testing.T, path string) {
			hugeFile(t, path)
			for i := range int64(64) {
				writeAt(t, path, string(make([]byte, 1<<20)), i<<30)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.make(t, filepath.Join(dir, "f"))
			ctx := &countdownCtx{Context: t.Context(), n: 3}
			_, err := listDir(t, ctx, dir)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("listing with a context cancelled mid-file = %v, want context.Canceled", err)
			}
			if got := ctx.calls.Load(); got > 8 {
				t.Errorf("the context was checked %d times: the reading went on after it was cancelled", got)
			}
		})
	}
}

// TestExportSparseFile: an export writes a file with holes whole, the
// holes as zeros, data where it is.
func TestExportSparseFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	writeAt(t, path, "data", 1<<20)
	if err := os.Truncate(path, 2<<20); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var buf bytes.Buffer
	if err := writeLayer(t.Context(), fd, &buf, 8<<20, nil, false); err != nil {
		t.Fatalf("writeLayer: %v", err)
	}
	want := make([]byte, 2<<20)
	copy(want[1<<20:], "data")
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("no changes/f in the export: %v", err)
		}
		if hdr.Name != "changes/f" {
			continue
		}
		got, err := io.ReadAll(tr)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("changes/f: %d bytes (%v), want 2 MiB of zeros with data at 1 MiB", len(got), err)
		}
		return
	}
}

// TestArchiveListsOversizeFile: a killed sandbox's archive lists a file
// larger than the cap left (a 16 TiB sparse one) and keeps the rest of
// the layer, where an export refuses the whole layer.
func TestArchiveListsOversizeFile(t *testing.T) {
	dir := t.TempDir()
	huge := filepath.Join(dir, "huge")
	writeAt(t, huge, "x", 0)
	if err := os.Truncate(huge, 1<<44-4096); err != nil {
		// a filesystem that holds smaller files: the cap below is what
		// matters, not the size
		if err := os.Truncate(huge, 64<<20); err != nil {
			t.Fatal(err)
		}
	}
	writeAt(t, filepath.Join(dir, "evidence"), "the sandbox did this", 0)
	// Each walk opens the layer anew: a directory's read offset is its
	// descriptor's.
	open := func() int {
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	const limit = 8 << 20
	if err := writeLayer(t.Context(), open(), io.Discard, limit, nil, false); !errors.Is(err, forensics.ErrTooLarge) {
		t.Fatalf("export of a layer with a file over the cap: %v, want ErrTooLarge", err)
	}
	var buf bytes.Buffer
	if err := writeLayer(t.Context(), open(), &buf, limit, nil, true); err != nil {
		t.Fatalf("archive of a layer with a file over the cap: %v", err)
	}
	got := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[hdr.Name] = string(b)
	}
	if got["changes/evidence"] != "the sandbox did this" {
		t.Errorf("changes/evidence = %q, want the file kept", got["changes/evidence"])
	}
	if _, ok := got["changes/huge"]; ok {
		t.Errorf("changes/huge kept in the archive, over its cap")
	}
	if !strings.Contains(got["changes/.whiteouts"], "# not kept: /huge (") {
		t.Errorf("changes/.whiteouts does not list the file left out:\n%s", got["changes/.whiteouts"])
	}
}
