package daemon

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

func TestAPIKey(t *testing.T) {
	dir := t.TempDir()
	key, path, err := apiKey(Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(key) {
		t.Errorf("generated key %q, want e2b_ and 40 hex digits (the SDKs' format)", key)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file %s: %v, mode %v; want 0600", path, err, st.Mode().Perm())
	}
	again, _, err := apiKey(Config{DataDir: dir})
	if err != nil || again != key {
		t.Errorf("second start: key %q, %v; want the stored %q", again, err, key)
	}
	// A key file left world-readable (an older install) is narrowed.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := apiKey(Config{DataDir: dir}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file left 0644: after start %v, mode %v; want 0600", err, st.Mode().Perm())
	}
	if got, path, _ := apiKey(Config{DataDir: dir, APIKey: "e2b_given"}); got != "e2b_given" || path != "" {
		t.Errorf("apiKey with a key given = %q, %q; want it, and no file", got, path)
	}
	os.WriteFile(filepath.Join(dir, "api-key"), []byte("not a key\n"), 0o600)
	if _, _, err := apiKey(Config{DataDir: dir}); err == nil {
		t.Error("a corrupt key file was accepted")
	}
}

func TestLockDataDir(t *testing.T) {
	defer func(d time.Duration) { lockWait = d }(lockWait)
	lockWait = 300 * time.Millisecond
	dir := t.TempDir()
	unlock, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockDataDir(dir); err == nil {
		t.Fatal("a second daemon locked the same data dir")
	}
	unlock()
	unlock2, err := lockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after the first daemon left: %v", err)
	}
	unlock2()
}
