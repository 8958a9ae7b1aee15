package bench

import (
	"os"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/testutil"
)

// The probe pivots on threads of its own: the host's mounts, and this
// process's root and working directory, are as they were.
func TestKernelPivots(t *testing.T) {
	testutil.RequireRoot(t)
	mounts0, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	wd0, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	r := kernelPivots(5)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if len(r.Samples) != 5 {
		t.Fatalf("%d samples, want 5", len(r.Samples))
	}
	for _, d := range r.Samples {
		if d <= 0 {
			t.Errorf("sample %v, want a positive duration", d)
		}
	}
	mounts1, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	// Other tests mount and unmount meanwhile (go test runs packages at
	// once): what must hold is that the host's root is where it was and
	// that nothing of the pivots' own directories is mounted on the host.
	if a, b := rootMount(string(mounts0)), rootMount(string(mounts1)); a == "" || a != b {
		t.Errorf("the host's root mount changed: before %q, after %q", a, b)
	}
	if strings.Contains(string(mounts1), "fence-bench-pivot-") {
		t.Errorf("a pivot's mount is left on the host:\n%s", mounts1)
	}
	if wd, err := os.Getwd(); err != nil || wd != wd0 {
		t.Errorf("working directory %q (%v), want %q", wd, err, wd0)
	}
	if _, err := os.Stat("/proc/self/exe"); err != nil {
		t.Errorf("the process's root moved: %v", err)
	}
}

// rootMount returns the mountinfo line of the mount on "/".
func rootMount(mountinfo string) string {
	for _, l := range strings.Split(mountinfo, "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == "/" {
			return l
		}
	}
	return ""
}
