package forensics

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

func layer(t *testing.T, size int) func(io.Writer) error {
	return func(w io.Writer) error {
		tw := tar.NewWriter(w)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "changes/f", Size: int64(size), Mode: 0o644}); err != nil {
			return err
		}
		// Incompressible enough that the archive's size follows size.
		b := make([]byte, size)
		rand.Read(b)
		if _, err := tw.Write(b); err != nil {
			return err
		}
		return tw.Close()
	}
}

// TestArchiveBudgetAndRetention: archives are 0600, an expired one is
// gone, the oldest go first over the budget, one over the budget alone is
// not kept, a failed Put leaves nothing, and bad IDs are refused.
func TestArchiveBudgetAndRetention(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "forensics")
	a, err := OpenArchive(dir, time.Hour, 300<<10)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	a.now = func() time.Time { return now }
	for _, id := range []string{"aaa", "bbb", "ccc"} {
		if err := a.Put(id, layer(t, 120<<10)); err != nil {
			t.Fatal(err)
		}
		// Distinct, increasing times: aaa is the oldest.
		now = now.Add(time.Minute)
		os.Chtimes(filepath.Join(dir, id+".tar.gz"), now, now)
	}
	if _, err := a.Open("aaa"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("the oldest archive is still there over the budget: %v", err)
	}
	for _, id := range []string{"bbb", "ccc"} {
		rc, err := a.Open(id)
		if err != nil {
			t.Fatalf("Open(%s): %v", id, err)
		}
		h, err := tar.NewReader(rc).Next()
		if err != nil || h.Name != "changes/f" {
			t.Errorf("Open(%s): %v %v", id, h, err)
		}
		rc.Close()
		st, _ := os.Stat(filepath.Join(dir, id+".tar.gz"))
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s is %v, want 0600", id, st.Mode())
		}
	}
	// Expired: refused at Open, removed at the next prune.
	now = now.Add(2 * time.Hour)
	if _, err := a.Open("ccc"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("an expired archive opens: %v", err)
	}
	a.Prune()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left after prune: %v", ents)
	}
	if err := a.Put("big", layer(t, 400<<10)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Open("big"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("an archive over the whole budget is kept: %v", err)
	}
	if err := a.Put("fail", func(io.Writer) error { return errors.New("boom") }); err == nil {
		t.Errorf("a failed Put succeeds")
	}
	for _, id := range []string{"../x", "", "A", strings.Repeat("a", 65)} {
		if err := a.Put(id, layer(t, 1)); err == nil {
			t.Errorf("Put(%q) accepted", id)
		}
		if _, err := a.Open(id); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("Open(%q): %v", id, err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

// TestWriteRefusesEntriesOutsideChanges: a layer stream naming anything
// but changes/… fails the export.
func TestWriteRefusesEntriesOutsideChanges(t *testing.T) {
	for _, name := range []string{"metadata.json", "changes/../x", "/etc/passwd"} {
		err := Write(context.Background(), io.Discard, Bundle{Layer: func(_ context.Context, w io.Writer) error {
			tw := tar.NewWriter(w)
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name})
			return tw.Close()
		}})
		if err == nil {
			t.Errorf("entry %q accepted", name)
		}
	}
	var buf bytes.Buffer
	if err := Write(context.Background(), &buf, Bundle{Metadata: map[string]string{"id": "x"},
		Audit: func(_ context.Context, w io.Writer) error { _, err := io.WriteString(w, "{}\n"); return err }}); err != nil {
		t.Fatal(err)
	}
}

// TestPutDoesNotListTheDirectory: a kill's archive costs the same with
// thousands of archives kept as with none: Put prunes from its index, and
// only Open and Prune read the directory; the index agrees with it.
func TestPutDoesNotListTheDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "forensics")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := range 50 { // a daemon's earlier kills, a minute apart
		p := filepath.Join(dir, fmt.Sprintf("old%d.tar.gz", i))
		os.WriteFile(p, make([]byte, 10<<10), 0o600)
		mod := time.Now().Add(time.Duration(i-50) * time.Minute)
		if err := os.Chtimes(p, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	lists := 0
	defer func(f func(string) ([]os.DirEntry, error)) { readDir = f }(readDir)
	readDir = func(d string) ([]os.DirEntry, error) { lists++; return os.ReadDir(d) }
	a, err := OpenArchive(dir, time.Hour, 600<<10)
	if err != nil {
		t.Fatal(err)
	}
	lists = 0
	for i := range 20 {
		if err := a.Put(fmt.Sprintf("new%d", i), layer(t, 20<<10)); err != nil {
			t.Fatal(err)
		}
	}
	if lists != 0 {
		t.Errorf("20 Puts listed the directory %d times", lists)
	}
	// The budget was kept from the index: the oldest went first.
	var total int64
	ents, _ := os.ReadDir(dir)
	names := map[string]bool{}
	for _, e := range ents {
		info, _ := e.Info()
		total += info.Size()
		names[e.Name()] = true
	}
	if total > 600<<10 || names["old0.tar.gz"] || !names["new19.tar.gz"] || !names["old49.tar.gz"] {
		t.Errorf("after the Puts: %d bytes in %d archives (old0 %v, old49 %v, new19 %v)", total, len(ents), names["old0.tar.gz"], names["old49.tar.gz"], names["new19.tar.gz"])
	}
	a.Prune()
	if lists != 1 {
		t.Errorf("Prune listed the directory %d times, want 1", lists)
	}
	var indexed int64
	for _, x := range a.arcs {
		indexed += x.size
	}
	if indexed != total || a.total != total || len(a.arcs) != len(ents) {
		t.Errorf("index: %d archives, %d bytes (total %d); directory: %d, %d", len(a.arcs), indexed, a.total, len(ents), total)
	}
}
