package embedded

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Keep names a file by its content, writes it once, read-only, and marks
// it used; collect removes other builds' binaries unused for a week and
// crashed writes, and nothing else.
func TestKeepAndCollect(t *testing.T) {
	dir := t.TempDir()
	p, err := Keep(dir, prefix, bytes.NewReader([]byte("one")))
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o555 {
		t.Fatalf("kept file: %v, %v; want mode 0555", st, err)
	}
	if b, _ := os.ReadFile(p); string(b) != "one" {
		t.Fatalf("kept file holds %q", b)
	}
	old := time.Now().Add(-30 * 24 * time.Hour)
	os.Chtimes(p, old, old)
	again, err := Keep(dir, prefix, bytes.NewReader([]byte("one")))
	if err != nil || again != p {
		t.Fatalf("Keep again = %q, %v; want %q", again, err, p)
	}
	if st, _ := os.Stat(p); time.Since(st.ModTime()) > time.Minute {
		t.Errorf("Keep of a kept file did not mark it used")
	}
	other, err := Keep(dir, prefix, bytes.NewReader([]byte("two")))
	if err != nil || other == p {
		t.Fatalf("Keep of other content = %q, %v", other, err)
	}
	crashed := filepath.Join(dir, ".tmp-"+prefix+"x-1")
	unrelated := filepath.Join(dir, "fence-0123456789abcdef") // gvisor's kept copies
	for _, f := range []string{crashed, unrelated} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{other, crashed, unrelated} {
		os.Chtimes(f, old, old)
	}
	collect(dir)
	for f, want := range map[string]bool{p: true, other: false, crashed: false, unrelated: true} {
		if _, err := os.Stat(f); (err == nil) != want {
			t.Errorf("%s kept = %v after collect, want %v", filepath.Base(f), err == nil, want)
		}
	}
}
