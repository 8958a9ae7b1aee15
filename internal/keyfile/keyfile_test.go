package keyfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadPrivateRefuses(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "key")
	if err := CreatePrivate(good, []byte("secret")); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(good); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("created key mode %v %v, want 0600", st.Mode(), err)
	}
	if b, err := ReadPrivate(good, 64); err != nil || string(b) != "secret" {
		t.Fatalf("ReadPrivate = %q, %v", b, err)
	}
	if _, err := ReadPrivate(filepath.Join(dir, "missing"), 64); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
	link := filepath.Join(dir, "link")
	os.Symlink(good, link)
	if _, err := ReadPrivate(link, 64); !errors.Is(err, ErrSymlink) {
		t.Errorf("symlink: %v, want ErrSymlink", err)
	}
	if _, err := ReadNoFollow(link, 64); !errors.Is(err, ErrSymlink) {
		t.Errorf("ReadNoFollow symlink: %v, want ErrSymlink", err)
	}
	if _, err := ReadPrivate(good, 3); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("oversized: %v", err)
	}
	for _, mode := range []os.FileMode{0o640, 0o604, 0o610, 0o601} {
		os.Chmod(good, mode)
		if _, err := ReadPrivate(good, 64); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Errorf("mode %04o: %v, want refused", mode, err)
		}
	}
	os.Chmod(good, 0o600)
	if _, err := ReadPrivate(dir, 64); err == nil {
		t.Error("a directory was read as a key")
	}
	if os.Geteuid() == 0 {
		os.Chown(good, 1000, 1000)
		if _, err := ReadPrivate(good, 64); err == nil || !strings.Contains(err.Error(), "owned by uid 1000") {
			t.Errorf("foreign owner: %v", err)
		}
	}
}

func TestCreatePrivateNeverReplaces(t *testing.T) {
	p := filepath.Join(t.TempDir(), "key")
	if err := CreatePrivate(p, []byte("first")); err != nil {
		t.Fatal(err)
	}
	if err := CreatePrivate(p, []byte("second")); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second create: %v, want ErrExist", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "first" {
		t.Fatalf("key replaced: %q", b)
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Fatalf("leftover temporary files: %v", entries)
	}
}

func TestWriteAtomic(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state")
	for _, v := range []string{"one", "two"} {
		if err := WriteAtomic(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != v {
			t.Fatalf("got %q want %q", b, v)
		}
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v", st.Mode())
	}
}
