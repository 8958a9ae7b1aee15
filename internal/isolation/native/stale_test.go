package native_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/quota"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestCleanupStaleRemovesOldSpelling: an earlier daemon on a data dir
// reached through a symlink named its instance after the symlink's
// spelling and, restarted, stacked a bind mount of its disk dir per start,
// hiding a sandbox's writable layer below them. A daemon on the resolved
// data dir (its own instance the resolved path's) removes all of it on
// start, down to the last mount and loop device, and leaves its own
// instance alone. Root: mounts, loop devices, cgroups.
func TestCleanupStaleRemovesOldSpelling(t *testing.T) {
	testutil.RequireRoot(t)
	base := testutil.StateDir(t)
	real := filepath.Join(base, "real")
	if err := os.Mkdir(real, 0o711); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { detachUnder(real) })
	stateLink, stateReal := filepath.Join(link, "native"), filepath.Join(real, "native")
	old, own := native.InstanceOf(stateLink), native.InstanceOf(stateReal)
	if old == own {
		t.Fatalf("both spellings hash to %s", own)
	}
	// The earlier daemon, on the symlink's spelling: its directories, a
	// sandbox's writable layer, then two stacked binds over its disk dir.
	b, err := native.New(t.Context(), native.Options{StateDir: stateLink, Executable: testutil.FenceBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	diskDir := filepath.Join(stateReal, "disk", old)
	fs, err := quota.Open(t.Context(), quota.Options{ImageDir: filepath.Join(stateLink, "images", old), MountDir: diskDir})
	if err != nil {
		t.Fatal(err)
	}
	const id = "leftoversandbox"
	if _, err := fs.NewDir(t.Context(), id, quota.MinLimit); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(stateReal, "sandboxes", old, id), 0o700); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := unix.Mount(diskDir, diskDir, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
	}
	// This daemon's own instance, which must stay.
	ownDir := filepath.Join(stateReal, "sandboxes", own)
	if err := os.MkdirAll(ownDir, 0o711); err != nil {
		t.Fatal(err)
	}

	if err := native.CleanupStale(context.Background(), stateReal, testutil.FenceBinary(t), nil); err != nil {
		t.Errorf("CleanupStale: %v", err)
	}
	for _, d := range []string{"sandboxes", "sock", "disk", "images"} {
		if _, err := os.Lstat(filepath.Join(stateReal, d, old)); err == nil {
			t.Errorf("%s/%s of the earlier instance remains", d, old)
		}
	}
	if _, err := os.Stat(ownDir); err != nil {
		t.Errorf("this daemon's own instance went: %v", err)
	}
	if m := testutil.MountPointsUnder(real); len(m) > 0 {
		t.Errorf("mounts remain under %s: %q", real, m)
	}
	if l := testutil.LoopsUnder(real); len(l) > 0 {
		t.Errorf("loop devices remain backed by files under %s: %q", real, l)
	}
}

// detachUnder detaches every mount at or below dir.
func detachUnder(dir string) {
	for _, mp := range testutil.MountPointsUnder(dir) {
		unix.Unmount(mp, unix.MNT_DETACH)
	}
}
