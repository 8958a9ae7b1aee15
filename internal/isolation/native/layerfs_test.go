package native_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/btrfs"
	"github.com/fencesandbox/fence/internal/isolation"
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

// A checkpoint does not move when the sandbox writes on: through an fd it
// held across the checkpoint (in place and appending) and through a
// shared mapping, to a file the checkpoint holds; the layer's entries,
// listed only when asked (after those writes), hash what was checkpointed.
// Symlinks in the writable layer, to the host's root and through /proc,
// are kept as symlinks and never followed by the listing, and a sandbox
// booted on the layer resolves them in its own root.
func TestCheckpointAttacks(t *testing.T) { forStores(t, testCheckpointAttacks) }

func testCheckpointAttacks(t *testing.T, opts native.Options) {
	b := newBackendWith(t, opts)
	rootfs := testutil.RootFS(t, "base")
	src := create(t, b, isolation.Spec{RootFS: rootfs})
	sh(t, src, `set -e
		mkdir -p /data && head -c 8192 /dev/zero | tr '\0' A > /data/f
		ln -s / /data/hostroot && ln -s /etc/hostname /data/hn && ln -s /proc/1/root /data/p1
		cat > /tmp/w.py <<'PY'
import mmap, os, time
fd = os.open("/data/f", os.O_RDWR)
ap = os.open("/data/f", os.O_WRONLY | os.O_APPEND)
m = mmap.mmap(fd, 8192)
open("/tmp/ready", "w").close()
while not os.path.exists("/tmp/go"):
    time.sleep(0.005)
os.pwrite(fd, b"BBBB", 0)
m[100:104] = b"MMMM"
m.flush()
os.write(ap, b"TAIL")
open("/tmp/done", "w").close()
time.sleep(3600)
PY
		python3 /tmp/w.py >/dev/null 2>&1 &
		for i in $(seq 500); do test -e /tmp/ready && break; sleep 0.01; done; test -e /tmp/ready`)
	orig := sh(t, src, `sha256sum /data/f | cut -d' ' -f1`)
	info, err := src.(isolation.Checkpointer).Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	sh(t, src, `touch /tmp/go; for i in $(seq 500); do test -e /tmp/done && break; sleep 0.01; done; test -e /tmp/done`)
	after := sh(t, src, `head -c 4 /data/f; dd if=/data/f bs=1 skip=100 count=4 2>/dev/null; tail -c 4 /data/f; echo`)
	if after != "BBBBMMMMTAIL\n" {
		t.Fatalf("the source's writes did not land: %q", after)
	}
	ch, err := b.LayerChanges(t.Context(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]isolation.FileChange{}
	for _, c := range ch {
		byPath[c.Path] = c
		for _, l := range []string{"/data/hostroot/", "/data/p1/", "/data/hn/"} {
			if strings.HasPrefix(c.Path, l) {
				t.Errorf("the layer's listing followed a symlink: %s", c.Path)
			}
		}
	}
	if c := byPath["/data/f"]; c.SHA256+"\n" != orig || c.Size != 8192 {
		t.Errorf("/data/f in the layer: %+v, want sha256 %q and 8192 bytes", c, orig)
	}
	for p, target := range map[string]string{"/data/hostroot": "/", "/data/hn": "/etc/hostname", "/data/p1": "/proc/1/root"} {
		if c := byPath[p]; c.Kind != "symlink" || c.Target != target {
			t.Errorf("%s in the layer: %+v, want a symlink to %s", p, c, target)
		}
	}
	f := createOnRoot(t, b, rootfs, info.ID)
	if got := sh(t, f, `sha256sum /data/f | cut -d' ' -f1`); got != orig {
		t.Errorf("a sandbox on the checkpoint reads /data/f with sha256 %q, want %q (the source's later writes reached it)", got, orig)
	}
	// The sandbox's own files, not the host's (whose /etc/hostname differs
	// from the template's here; the test itself proves nothing if not).
	want := sh(t, f, `echo marker-$$ > /etc/hostname; cat /etc/hostname /etc/hostname; echo /proc/1/root`)
	if got := sh(t, f, `cat /data/hostroot/etc/hostname /data/hn; readlink /data/p1`); got != want {
		t.Errorf("symlinks in the layer resolve to %q, want the sandbox's own %q", got, want)
	}
}

func createOnRoot(t *testing.T, b *native.Backend, rootfs, layer string) isolation.Sandbox {
	t.Helper()
	sb, err := b.CreateOn(t.Context(), isolation.Spec{RootFS: rootfs}, layer)
	if err != nil {
		t.Fatalf("CreateOn(%s): %v", layer, err)
	}
	t.Cleanup(func() { sb.Kill(context.Background()) })
	return sb
}
