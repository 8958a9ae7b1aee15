package gvisor_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/gvisor"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestCleanupStaleRemovesOldSpelling: an earlier daemon on a data dir
// reached through a symlink named its gvisor instance after the symlink's
// spelling and was killed with a sandbox running (a gvisor sandbox has no
// lifeline). CleanupStale on the resolved spelling deletes that sandbox,
// its cgroup and runsc's mounts of the old instance, and leaves its own
// instance alone. Root: runsc, cgroups, namespaces.
func TestCleanupStaleRemovesOldSpelling(t *testing.T) {
	runsc := testutil.RequireRunsc(t)
	rootfs := testutil.RootFS(t, "minimal")
	base := testutil.StateDir(t)
	real := filepath.Join(base, "real")
	if err := os.Mkdir(real, 0o711); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, mp := range testutil.MountPointsUnder(real) {
			unix.Unmount(mp, unix.MNT_DETACH)
		}
	})
	stateLink, stateReal := filepath.Join(link, "gvisor"), filepath.Join(real, "gvisor")
	old, own := gvisor.InstanceOf(stateLink), gvisor.InstanceOf(stateReal)
	opts := gvisor.Options{Runsc: runsc, Executable: testutil.FenceBinary(t), Network: isolationtest.Network(nil)}
	// The earlier instance's sandbox, made on the resolved path (runsc
	// cannot run one on the symlink's spelling).
	o := opts
	o.StateDir, o.Instance = stateReal, old
	b, err := gvisor.New(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Create(t.Context(), isolation.Spec{RootFS: rootfs})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { sb.Kill(context.Background()) })
	// The daemon is gone (SIGKILL): nothing of b is closed.
	ownDir := filepath.Join(stateReal, "runsc", own)
	if err := os.MkdirAll(ownDir, 0o700); err != nil {
		t.Fatal(err)
	}
	o = opts
	o.StateDir = stateReal
	if err := gvisor.CleanupStale(context.Background(), o); err != nil {
		t.Errorf("CleanupStale: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(stateReal, "sandboxes", old)); len(ents) > 0 {
		t.Errorf("sandboxes of the earlier instance remain: %v", ents)
	}
	// cgroup v2, or v1's hierarchies.
	v2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "fence", old, "*", "cgroup.procs"))
	v1, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "fence", old, "*", "cgroup.procs"))
	if dirs := append(v2, v1...); len(dirs) > 0 {
		t.Errorf("cgroups of the earlier instance remain: %q", dirs)
	}
	if m := testutil.MountPointsUnder(real); len(m) > 0 {
		t.Errorf("mounts remain under %s: %q", real, m)
	}
	if _, err := os.Stat(ownDir); err != nil {
		t.Errorf("this daemon's own instance went: %v", err)
	}
}
