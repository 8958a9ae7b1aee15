package fs

import (
	"os"
	"syscall"
	"testing"
)

func TestMoveByCopy(t *testing.T) {
	d := t.TempDir()
	os.MkdirAll(d+"/src/sub", 0o750)
	os.WriteFile(d+"/src/sub/f", []byte("data"), 0o640)
	os.Symlink("sub/f", d+"/src/link")
	os.Chown(d+"/src/sub/f", 65534, 65534)
	if err := moveByCopy(d+"/src", d+"/dst"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(d + "/src"); !os.IsNotExist(err) {
		t.Errorf("source still exists: %v", err)
	}
	if b, err := os.ReadFile(d + "/dst/link"); err != nil || string(b) != "data" {
		t.Errorf("dst/link reads %q, %v; want data", b, err)
	}
	fi, err := os.Stat(d + "/dst/sub")
	if err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("dst/sub mode = %v, %v; want 0750", fi, err)
	}
	if uid, _, mode := ownerOf(t, d+"/dst/sub/f"); uid != 65534 || mode.Perm() != 0o640 {
		t.Errorf("dst/sub/f uid %d mode %v, want 65534 0640", uid, mode)
	}
	if err := moveByCopy(d+"/dst/sub", d+"/dst"); err == nil {
		t.Error("moveByCopy onto an existing path succeeded")
	}
}

func ownerOf(t *testing.T, p string) (uint32, uint32, os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid, fi.Mode()
}
