package fs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/agent/users"
	"github.com/fencesandbox/fence/internal/testutil"
)

// testUser is an unprivileged account that exists only by its IDs.
var testUser = &users.User{Name: "fence-test", UID: 64321, GID: 64321}

// searchableTempDir is a root-owned directory of mode 0755 whose
// ancestors testUser may search.
func searchableTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func owner(t *testing.T, path string) uint32 {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid
}

// TestEnsureDirCreatesWhereUserMayNot proves that missing parents in a
// directory the user may not write (as / is) are created for the user and
// owned by them, as envd does. It needs root: the agent's side of the
// creation is root's.
func TestEnsureDirCreatesWhereUserMayNot(t *testing.T) {
	testutil.RequireRoot(t)
	root := searchableTempDir(t) // root's, 0755: the user may not write it
	dir := filepath.Join(root, "0", "sub")
	if err := asUser(testUser, func() error { return ensureDir(dir, testUser) }); err != nil {
		t.Fatalf("ensureDir(%s) as %s: %v", dir, testUser.Name, err)
	}
	for _, d := range []string{filepath.Join(root, "0"), dir} {
		if got := owner(t, d); got != testUser.UID {
			t.Errorf("owner of %s = %d, want %d", d, got, testUser.UID)
		}
	}
	// The file itself is the user's to create now.
	f := filepath.Join(dir, "f")
	if err := asUser(testUser, func() error { return os.WriteFile(f, []byte("x"), 0o644) }); err != nil {
		t.Fatalf("writing %s as %s: %v", f, testUser.Name, err)
	}
	if got := owner(t, root); got != 0 {
		t.Errorf("owner of %s = %d, want 0 (unchanged)", root, got)
	}
}

// TestEnsureDirFollowsNoPlantedSymlink proves that a symlink the user
// planted on the path is never followed by the agent's creation: the
// user's /tmp/x -> /etc must not give them a new directory in /etc.
func TestEnsureDirFollowsNoPlantedSymlink(t *testing.T) {
	testutil.RequireRoot(t)
	root := searchableTempDir(t)
	etc := filepath.Join(root, "etc") // root's, 0755
	tmp := filepath.Join(root, "tmp")
	for _, d := range []string{etc, tmp} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(tmp, "x")
	if err := asUser(testUser, func() error { return os.Symlink(etc, link) }); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, dir string }{
		{"below the link", filepath.Join(link, "new", "deeper")},
		{"the link's target itself", filepath.Join(link, "new")},
		{"through a root-made link", filepath.Join(root, "etclink", "new")},
	}
	if err := os.Symlink(etc, filepath.Join(root, "etclink")); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := asUser(testUser, func() error { return ensureDir(tt.dir, testUser) })
			if !errors.Is(err, unix.EACCES) {
				t.Errorf("ensureDir(%s) = %v, want permission denied", tt.dir, err)
			}
			if _, err := os.Lstat(filepath.Join(etc, "new")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s/new exists after ensureDir(%s) (err %v): created through a symlink", etc, tt.dir, err)
			}
		})
	}
}

// TestEnsureDirNotInUnsearchable proves that nothing is created below a
// directory the user may not search (as /root is), even as root.
func TestEnsureDirNotInUnsearchable(t *testing.T) {
	testutil.RequireRoot(t)
	root := searchableTempDir(t)
	private := filepath.Join(root, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(private, "new")
	if err := asUser(testUser, func() error { return ensureDir(dir, testUser) }); !errors.Is(err, unix.EACCES) {
		t.Errorf("ensureDir(%s) = %v, want permission denied", dir, err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s exists (err %v), want nothing created", dir, err)
	}
}

// TestEnsureDirNotInUsersOwnReadOnly proves that the agent creates nothing
// for the user in a directory the user owns but has made read-only: the
// user could make it writable and swap its entries at any moment.
func TestEnsureDirNotInUsersOwnReadOnly(t *testing.T) {
	testutil.RequireRoot(t)
	root := searchableTempDir(t)
	ro := filepath.Join(root, "ro")
	if err := os.Mkdir(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ro, int(testUser.UID), int(testUser.GID)); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(ro, "new")
	if err := asUser(testUser, func() error { return ensureDir(dir, testUser) }); !errors.Is(err, unix.EACCES) {
		t.Errorf("ensureDir(%s) = %v, want permission denied", dir, err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s exists (err %v), want nothing created", dir, err)
	}
}
