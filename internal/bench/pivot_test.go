package bench

import (
	"os"
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
	if string(mounts0) != string(mounts1) {
		t.Errorf("the host's mounts changed:\nbefore:\n%s\nafter:\n%s", mounts0, mounts1)
	}
	if wd, err := os.Getwd(); err != nil || wd != wd0 {
		t.Errorf("working directory %q (%v), want %q", wd, err, wd0)
	}
	if _, err := os.Stat("/proc/self/exe"); err != nil {
		t.Errorf("the process's root moved: %v", err)
	}
}
