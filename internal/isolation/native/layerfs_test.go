package native_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/btrfs"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/testutil"
)

// The btrfs layer store is tested on a btrfs filesystem in a loop-mounted
// image, one per test binary: mkfs.btrfs (btrfs-progs, installed by
// scripts/setup.sh) is required under CI.
var (
	layerFSOnce sync.Once
	layerFSDir  string
	layerFSErr  error
)

// layerFS returns a directory on btrfs for a test's store.
func layerFS(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)
	layerFSOnce.Do(func() {
		if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
			layerFSErr = err
			return
		}
		dir, err := os.MkdirTemp("", "fence-layerfs-")
		if err != nil {
			layerFSErr = err
			return
		}
		layerFSDir = filepath.Join(dir, "mnt")
		layerFSErr = btrfs.MountImage(t.Context(), filepath.Join(dir, "layerfs.img"), layerFSDir, 4<<30)
		if layerFSErr == nil {
			cleanups = append(cleanups, func() {
				unix.Unmount(layerFSDir, unix.MNT_DETACH)
				os.RemoveAll(dir)
			})
		}
	})
	if layerFSErr != nil {
		if testutil.InCI() {
			t.Fatalf("no btrfs for the layer store (scripts/setup.sh installs btrfs-progs): %v", layerFSErr)
		}
		t.Skipf("no btrfs for the layer store: %v", layerFSErr)
	}
	dir, err := os.MkdirTemp(layerFSDir, "t-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// cleanups run once every test is done.
var cleanups []func()

func TestMain(m *testing.M) {
	code := m.Run()
	for _, f := range cleanups {
		f()
	}
	os.Exit(code)
}

// forStores runs f on the copy store and on the btrfs store.
func forStores(t *testing.T, f func(t *testing.T, opts native.Options)) {
	t.Run("copy", func(t *testing.T) { f(t, native.Options{CopyLayers: true}) })
	t.Run("btrfs", func(t *testing.T) { f(t, native.Options{LayerFS: layerFS(t)}) })
}
