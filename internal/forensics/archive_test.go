package forensics

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
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
