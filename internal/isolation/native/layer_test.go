package native_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/forensics"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
)

// TestExportLayer: a running sandbox's layer is read through the
// backend (its host mount is detached): a symlink to the host's root is
// kept as a symlink and nothing below it is read, the cap is a clear
// ErrTooLarge that LayerSize predicts, and at kill the layer is archived.
func TestExportLayer(t *testing.T) { forStores(t, testExportLayer) }

func testExportLayer(t *testing.T, opts native.Options) {
	archive, err := forensics.OpenArchive(filepath.Join(t.TempDir(), "forensics"), time.Hour, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	opts.Forensics = archive
	b := newBackendWith(t, opts)
	sb := create(t, b, isolation.Spec{})
	// /etc/hosts is fence's, changed here with its mtime put back.
	r := run(t, sb, "root", "/bin/sh", "-c", "mkdir -p /opt && ln -s / /opt/hostroot && dd if=/dev/zero of=/opt/big bs=1M count=2 2>/dev/null && "+
		"touch -r /etc/hosts /opt/stamp && echo '192.0.2.1 changed' >> /etc/hosts && touch -r /opt/stamp /etc/hosts && echo ok")
	if r.stdout != "ok\n" {
		t.Fatalf("setup: %q %q", r.stdout, r.stderr)
	}
	// A directory of the template removed and made again is opaque.
	if r := run(t, sb, "root", "/bin/sh", "-c", "rm -rf /home/user && mkdir -m 0777 /home/user && echo ok"); r.stdout != "ok\n" {
		t.Fatalf("setup: %q %q", r.stdout, r.stderr)
	}
	lr := sb.(isolation.LayerReader)
	size, err := lr.LayerSize(t.Context())
	if err != nil || size < 2<<20 || size > 4<<20 {
		t.Fatalf("LayerSize = %d, %v; want a little over 2 MiB", size, err)
	}
	if err := lr.ExportLayer(t.Context(), io.Discard, 1<<20); !errors.Is(err, forensics.ErrTooLarge) {
		t.Errorf("ExportLayer over the cap: %v, want ErrTooLarge", err)
	}
	var buf bytes.Buffer
	if err := lr.ExportLayer(t.Context(), &buf, size); err != nil {
		t.Fatalf("ExportLayer at LayerSize: %v", err)
	}
	names := tarNames(t, bytes.NewReader(buf.Bytes()))
	if w := tarFile(t, &buf, "changes/.whiteouts"); !strings.Contains(w, "\n/home/user/ opaque\n") {
		t.Errorf("changes/.whiteouts does not list /home/user as opaque:\n%s", w)
	}
	if h := names["changes/opt/hostroot"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/" {
		t.Errorf("changes/opt/hostroot = %+v, want a symlink to /", h)
	}
	for n := range names {
		if len(n) > len("changes/opt/hostroot/") && n[:len("changes/opt/hostroot/")] == "changes/opt/hostroot/" {
			t.Errorf("the symlink was followed: %s", n)
		}
	}
	if h := names["changes/opt/big"]; h == nil || h.Size != 2<<20 {
		t.Errorf("changes/opt/big = %+v", h)
	}
	if names["changes/etc/resolv.conf"] == nil {
		t.Errorf("the export leaves out /etc/resolv.conf, which is in the layer")
	}
	if err := sb.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	var rc io.ReadCloser
	for deadline := time.Now().Add(30 * time.Second); ; {
		if rc, err = archive.Open(sb.ID()); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("the killed sandbox's layer is not archived: %v", err)
	}
	defer rc.Close()
	archived := tarNames(t, rc)
	if h := archived["changes/opt/hostroot"]; h == nil || h.Typeflag != tar.TypeSymlink {
		t.Errorf("archived changes/opt/hostroot = %+v", h)
	}
	// The files fence wrote and the sandbox left alone are not archived;
	// a changed one is, whatever its mtime says.
	if h := archived["changes/etc/resolv.conf"]; h != nil {
		t.Errorf("the archive holds fence's unchanged /etc/resolv.conf")
	}
	if h := archived["changes/etc/hosts"]; h == nil {
		t.Errorf("the archive leaves out /etc/hosts, changed by the sandbox (mtime put back)")
	}
	// The layer is released after it is archived: the archive can be
	// seen a moment before the release.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := lr.LayerSize(t.Context()); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("LayerSize after kill still succeeds 30 s later")
			break
		}
	}
}

func tarNames(t *testing.T, r io.Reader) map[string]*tar.Header {
	t.Helper()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h
	}
}

// tarFile is the content of the file name in the tar stream r, "" if none.
func tarFile(t *testing.T, r io.Reader, name string) string {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
	}
}
