package btrfs

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/testutil"
)

// mounted returns a fresh btrfs filesystem in a loop-mounted image.
func mounted(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		if testutil.InCI() {
			t.Fatalf("mkfs.btrfs missing (scripts/setup.sh installs btrfs-progs): %v", err)
		}
		t.Skip("no mkfs.btrfs")
	}
	dir := t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	if err := MountImage(t.Context(), filepath.Join(dir, "img"), mnt, 1<<30); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	// A second MountImage finds the mount in place.
	if err := MountImage(t.Context(), filepath.Join(dir, "img"), mnt, 1<<30); err != nil {
		t.Fatalf("MountImage on a mounted image: %v", err)
	}
	return mnt
}

func openDir(t *testing.T, p string) int {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// A read-only snapshot keeps what the subvolume held, whatever is written
// to the subvolume afterwards (in place through an fd opened before), and
// refuses writes; deleting removes it with its files.
func TestSnapshot(t *testing.T) {
	mnt := mounted(t)
	root := openDir(t, mnt)
	if err := CreateSubvolume(root, "sv"); err != nil {
		t.Fatal(err)
	}
	if !IsSubvolume(root, "sv") {
		t.Fatal("IsSubvolume(sv) = false")
	}
	f := filepath.Join(mnt, "sv", "f")
	if err := os.WriteFile(f, bytes.Repeat([]byte("A"), 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	held, err := os.OpenFile(f, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	sv := openDir(t, filepath.Join(mnt, "sv"))
	start := time.Now()
	if err := Snapshot(sv, root, "snap", true); err != nil {
		t.Fatal(err)
	}
	t.Logf("read-only snapshot: %v", time.Since(start))
	if _, err := held.WriteAt([]byte("BBBB"), 0); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(mnt, "snap", "f"))
	if err != nil || !bytes.Equal(got, bytes.Repeat([]byte("A"), 8192)) {
		t.Errorf("the snapshot changed with its source: %q..., %v", got[:8], err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "snap", "g"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("a write into the read-only snapshot: %v, want EROFS", err)
	}
	for _, bad := range []string{"", ".", "..", "a/b", "x\x00"} {
		if err := Snapshot(sv, root, bad, true); err == nil {
			t.Errorf("Snapshot named %q succeeded", bad)
		}
	}
	if err := RemoveAll(filepath.Join(mnt, "snap")); err != nil {
		t.Fatal(err)
	}
	if err := RemoveAll(filepath.Join(mnt, "sv")); err != nil {
		t.Fatal(err)
	}
	if err := RemoveAll(filepath.Join(mnt, "gone")); err != nil {
		t.Errorf("RemoveAll of a missing path: %v", err)
	}
	if ents, _ := os.ReadDir(mnt); len(ents) != 0 {
		t.Errorf("left after RemoveAll: %v", ents)
	}
}

// A limited subvolume refuses writes past its limit; its usage counts
// what it wrote.
func TestLimitAndUsage(t *testing.T) {
	mnt := mounted(t)
	root := openDir(t, mnt)
	if err := EnableSimpleQuota(root); err != nil {
		t.Fatal(err)
	}
	if err := CreateSubvolume(root, "sv"); err != nil {
		t.Fatal(err)
	}
	sv := openDir(t, filepath.Join(mnt, "sv"))
	if err := Limit(sv, 8<<20); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(mnt, "sv", "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var werr error
	for i := 0; i < 32 && werr == nil; i++ {
		if _, werr = f.Write(buf); werr == nil {
			werr = f.Sync()
		}
	}
	if !errors.Is(werr, unix.EDQUOT) {
		t.Errorf("32 MiB into a subvolume limited to 8 MiB: %v, want EDQUOT", werr)
	}
	unix.Syncfs(sv)
	u, err := Usage(sv)
	if err != nil || u < 4<<20 || u > 9<<20 {
		t.Errorf("Usage = %d, %v; want about the 8 MiB written", u, err)
	}
}
