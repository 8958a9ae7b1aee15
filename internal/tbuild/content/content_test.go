package content

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tbuild/content/contenttest"
)

// A layer is applied to a clone without writing the parent's files (they
// are shared hard links) and without following a symlink of the tree to
// outside it.
func TestApplyLayerSafety(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (chown)")
	}
	dir := t.TempDir()
	parent := filepath.Join(dir, "parent")
	outside := filepath.Join(dir, "outside")
	for _, d := range []string{parent + "/etc", parent + "/opaque/old", parent + "/gone", outside} {
		os.MkdirAll(d, 0o755)
	}
	os.WriteFile(parent+"/etc/shared", []byte("parent content"), 0o644)
	os.WriteFile(parent+"/opaque/old/f", []byte("x"), 0o644)
	os.WriteFile(parent+"/gone/f", []byte("x"), 0o644)
	// Both links lead to a directory of the test's own, never to a host
	// path: a broken ApplyLayer must not be able to harm the machine.
	os.Symlink(outside, parent+"/escape")
	os.Symlink("../outside", parent+"/rellink")

	child := filepath.Join(dir, "child")
	if err := CloneTree(context.Background(), parent, child); err != nil {
		t.Fatal(err)
	}
	var a, b syscall.Stat_t
	syscall.Stat(parent+"/etc/shared", &a)
	syscall.Stat(child+"/etc/shared", &b)
	if a.Ino != b.Ino {
		t.Fatalf("clone did not hard-link files")
	}
	now := time.Now()
	layer := layerTar(t, []tar.Header{
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now},
		{Name: "etc/shared", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 1<<24 + 3*65536 + 1000, Gid: 1<<24 + 3*65536 + 1000, ModTime: now},
		{Name: "opaque/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now},
		{Name: "opaque/new", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: now},
	}, map[string]string{"changes/etc/shared": "child content", "changes/opaque/new": "n"}, "# header\n/gone\n/opaque/ opaque\n")
	if err := ApplyLayer(context.Background(), child, layer); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(parent + "/etc/shared"); string(b) != "parent content" {
		t.Errorf("the parent's file was written through its hard link: %q", b)
	}
	if b, _ := os.ReadFile(child + "/etc/shared"); string(b) != "child content" {
		t.Errorf("child file = %q", b)
	}
	var st syscall.Stat_t
	syscall.Stat(child+"/etc/shared", &st)
	if st.Uid != 1000 || st.Gid != 1000 || st.Mode&0o7777 != 0o755 {
		t.Errorf("child file uid %d gid %d mode %o, want 1000 1000 755 (sandbox ids mapped back, set-id bits cleared)", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if _, err := os.Lstat(child + "/gone"); !os.IsNotExist(err) {
		t.Errorf("whiteout not applied: %v", err)
	}
	if _, err := os.Lstat(child + "/opaque/old"); !os.IsNotExist(err) {
		t.Errorf("opaque directory kept the parent's entries: %v", err)
	}
	if _, err := os.Lstat(parent + "/opaque/old/f"); err != nil {
		t.Errorf("the parent lost a file: %v", err)
	}

	// Entries below a symlink of the tree are refused, never followed.
	for _, name := range []string{"escape/pwned", "rellink/pwned"} {
		evil := layerTar(t, []tar.Header{{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, ModTime: now}},
			map[string]string{"changes/" + name: "pwned"}, "")
		if err := ApplyLayer(context.Background(), child, evil); err == nil {
			t.Errorf("applying %s through a symlink succeeded", name)
		}
	}
	os.WriteFile(outside+"/victim", []byte("keep"), 0o644)
	os.WriteFile(outside+"/victim2", []byte("keep"), 0o644)
	evil := layerTar(t, nil, nil, "/escape/victim\n/rellink/victim2\n/escape/ opaque\n")
	_ = ApplyLayer(context.Background(), child, evil)
	if entries, _ := os.ReadDir(outside); len(entries) != 2 {
		t.Errorf("a whiteout below a symlink removed files outside the tree: %d entries left, want 2", len(entries))
	}
}

func TestStoreArchive(t *testing.T) {
	dir := t.TempDir()
	hash := strings.Repeat("ab", 32)
	tarOf := func(hdrs ...tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			if h.Typeflag == tar.TypeReg {
				h.Size = 1
			}
			tw.WriteHeader(&h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()
		return buf.Bytes()
	}
	gz := func(b []byte) []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write(b)
		zw.Close()
		return buf.Bytes()
	}
	good := tarOf(tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755}, tar.Header{Name: "app/a", Typeflag: tar.TypeReg, Mode: 0o644})
	for _, c := range []struct {
		name string
		body []byte
		ok   bool
	}{
		{"plain tar", good, true},
		{"gzipped tar", gz(good), true},
		{"garbage", []byte("this is not a tar archive at all, not even close....."), false},
		{"truncated gzip", gz(good)[:20], false},
		{"dot-dot entry", tarOf(tar.Header{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644}), false},
		{"absolute entry", tarOf(tar.Header{Name: "/etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}), false},
		{"device entry", tarOf(tar.Header{Name: "dev", Typeflag: tar.TypeChar, Mode: 0o644}), false},
		{"too large", gz(bytes.Repeat(good, 1)), true},
	} {
		os.RemoveAll(filepath.Join(dir, hash+".tar"))
		_, _, err := storeArchive(context.Background(), dir, hash, bytes.NewReader(c.body), 1<<20)
		if c.ok != (err == nil) {
			t.Errorf("%s: err = %v", c.name, err)
		}
		if err != nil && !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", c.name, err)
		}
		_, serr := os.Stat(filepath.Join(dir, hash+".tar"))
		if c.ok != (serr == nil) {
			t.Errorf("%s: kept = %v", c.name, serr == nil)
		}
	}
	if _, _, err := storeArchive(context.Background(), dir, hash, bytes.NewReader(bytes.Repeat([]byte{0}, 4096)), 1024); err == nil {
		t.Errorf("an archive above the limit was kept")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			t.Errorf("leftover %s", e.Name())
		}
	}
}

// An archive kept under a files hash is written once: the same files
// again (other order, times and owners) are accepted and change nothing;
// other files under that hash are refused and the kept archive stays.
func TestStoreArchiveWriteOnce(t *testing.T) {
	dir := t.TempDir()
	hash := strings.Repeat("cd", 32)
	final := filepath.Join(dir, hash+".tar")
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	first := contenttest.TarFiles(t, t0, "app/a", "A", "app/b", "B")
	d1, created, err := storeArchive(t.Context(), dir, hash, bytes.NewReader(first), 1<<20)
	if err != nil || !created {
		t.Fatalf("first upload: created %v, %v", created, err)
	}
	same := contenttest.TarFiles(t, t0.Add(time.Hour), "app/b", "B", "app/a", "A")
	d2, created, err := storeArchive(t.Context(), dir, hash, bytes.NewReader(same), 1<<20)
	if err != nil || created || d2 != d1 {
		t.Errorf("the same files again: created %v, digest %.12s (first %.12s), %v; want accepted, nothing written", created, d2, d1, err)
	}
	for name, body := range map[string][]byte{
		"other content":  contenttest.TarFiles(t, t0, "app/a", "A", "app/b", "evil"),
		"one more file":  contenttest.TarFiles(t, t0, "app/a", "A", "app/b", "B", "app/c", "C"),
		"one file fewer": contenttest.TarFiles(t, t0, "app/a", "A"),
	} {
		_, created, err := storeArchive(t.Context(), dir, hash, bytes.NewReader(body), 1<<20)
		if !errors.Is(err, api.ErrConflict) || created {
			t.Errorf("%s: created %v, %v; want ErrConflict", name, created, err)
		}
	}
	if got, _ := os.ReadFile(final); !bytes.Equal(got, first) {
		t.Error("the kept archive changed")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files in the files directory, want only the kept archive", len(entries))
	}
}

// layerTar writes an archive as isolation.LayerReader.ExportLayer does.
func layerTar(t *testing.T, entries []tar.Header, contents map[string]string, whiteouts string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		h.Name = "changes/" + h.Name
		body := contents[h.Name]
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.WriteHeader(&tar.Header{Name: "changes/.whiteouts", Typeflag: tar.TypeReg, Size: int64(len(whiteouts)), Mode: 0o644})
	tw.Write([]byte(whiteouts))
	tw.Close()
	p := filepath.Join(t.TempDir(), "layer.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
