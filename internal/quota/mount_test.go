package quota

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/testutil"
)

// isMountPoint must agree with mountinfo without reading it.
func TestIsMountPoint(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	sub := filepath.Join(dir, "sub")
	for _, tc := range []struct {
		path string
		want bool
	}{{"/", true}, {"/proc", true}, {dir, false}, {sub, false}} {
		if got, err := isMountPoint(tc.path); err != nil || got != tc.want {
			t.Errorf("isMountPoint(%s) = %v, %v; want %v", tc.path, got, err, tc.want)
		}
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	got, err := isMountPoint(dir)
	m, ferr := findMount(dir)
	if err != nil || ferr != nil || !got || m == nil {
		t.Errorf("after a bind mount: isMountPoint = %v, %v; findMount = %v, %v; want both to see it", got, err, m, ferr)
	}
}
