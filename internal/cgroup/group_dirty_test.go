package cgroup

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// A group with the memory controller tells its dirty page cache (zero or
// more); -1 is only for a kernel that does not.
func TestDirtyBytes(t *testing.T) {
	m := testManager(t)
	g, err := m.Create("dirty", Limits{})
	if err != nil {
		t.Fatalf("Create error: %v", err)
	}
	defer g.Remove(context.Background())
	start(t, g, "exec sleep 30")
	if n := g.DirtyBytes(); n < 0 {
		t.Errorf("DirtyBytes() = %d, want >= 0 on a group with the memory controller", n)
	}
}

// The v2 freezer waits on cgroup.events notifications. On a host whose
// cgroups are v1 the test uses the cgroup2 hierarchy mounted beside them
// (a hybrid layout), which has the freezer without any controller.
func TestFreezeV2Events(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: creates a cgroup")
	}
	var root string
	for _, p := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			root = p
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup2 hierarchy mounted")
	}
	dir := filepath.Join(root, "fence-test-freeze-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	g := &Group{m: &Manager{v2: root}, id: "freeze-v2", dirs: map[string]string{"": dir}, fd: -1}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		os.Remove(dir)
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := g.Freeze(); err != nil {
			t.Fatalf("Freeze: %v", err)
		}
		if n, _ := readKey(dir, "cgroup.events", "frozen"); n != 1 {
			t.Fatalf("after Freeze, cgroup.events frozen = %d, want 1", n)
		}
		if err := g.Thaw(); err != nil {
			t.Fatalf("Thaw: %v", err)
		}
		if n, _ := readKey(dir, "cgroup.events", "frozen"); n != 0 {
			t.Fatalf("after Thaw, cgroup.events frozen = %d, want 0", n)
		}
	}
}
