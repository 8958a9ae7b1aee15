// Package testutil holds the helpers fence's tests share: the one place
// that decides whether a privileged test runs, and builders for the fence
// binary and templates that the end-to-end tests need.
//
// Privileged tests run when the uid is 0. Under CI=true a missing
// capability is a failure, never a skip: CI runs as root.
package testutil

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/template"
)

// InCI reports whether the tests run under CI (CI=true).
func InCI() bool { return os.Getenv("CI") == "true" }

// RequireRoot skips t unless it runs as root; under CI it fails instead.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if InCI() {
		t.Fatal("this test needs root, and CI runs as root: refusing to skip")
	}
	t.Skip("needs root")
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// FenceBinary returns the path of a static fence binary: $FENCE_BIN if set,
// else one built once per test process with CGO_ENABLED=0.
func FenceBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("FENCE_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("FENCE_BIN=%s: %v", p, err)
		}
		return p
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fence-test-bin-")
		if err != nil {
			binErr = err
			return
		}
		// Sandbox uids execute the binary: the directory must be searchable.
		if err := os.Chmod(dir, 0o755); err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "fence")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/fence")
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = &buildError{out: string(out), err: err}
		}
	})
	if binErr != nil {
		t.Fatalf("building fence: %v", binErr)
	}
	return binPath
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

var tmplMu sync.Mutex

// Templates returns a template store holding at least the minimal
// template: $FENCE_TEST_TEMPLATES if set (built there if missing), else a
// directory shared by the tests of this machine under the temp dir.
func Templates(t testing.TB) *template.Store {
	t.Helper()
	tmplMu.Lock()
	defer tmplMu.Unlock()
	dir := os.Getenv("FENCE_TEST_TEMPLATES")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "fence-test-templates")
	}
	st, err := template.New(template.Options{Dir: dir})
	if err != nil {
		t.Fatalf("template store: %v", err)
	}
	if _, err := st.Resolve("minimal"); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := st.Build(ctx, "minimal"); err != nil {
			t.Fatalf("building minimal template: %v", err)
		}
	}
	return st
}

// RootFS returns the root of template name, which must be built; "base"
// is skipped when missing outside CI (it takes minutes to build).
func RootFS(t testing.TB, name string) string {
	t.Helper()
	st := Templates(t)
	p, err := st.Resolve(name)
	if err != nil {
		if name != "minimal" && !InCI() {
			t.Skipf("template %s not built (run scripts/setup.sh): %v", name, err)
		}
		t.Fatalf("template %s: %v", name, err)
	}
	return p
}

// StateDir returns a fresh directory that sandbox uids can traverse (the
// native backend needs that of its state directory's ancestors), removed
// when t ends.
func StateDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fence-state-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// RequireRunsc returns the runsc binary the gvisor backend uses
// ($FENCE_RUNSC, else the cache scripts/build-runsc.sh fills). It skips t
// when there is none, and fails under CI, whose setup builds it.
func RequireRunsc(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	p := os.Getenv("FENCE_RUNSC")
	if p == "" {
		p = "/var/lib/fence/cache/runsc/runsc"
	}
	if _, err := os.Stat(p); err != nil {
		if InCI() {
			t.Fatalf("runsc missing at %s (scripts/setup.sh builds it with scripts/build-runsc.sh): %v", p, err)
		}
		t.Skipf("runsc missing at %s (build it with scripts/build-runsc.sh): %v", p, err)
	}
	return p
}

// MountPointsUnder lists the mount points of this mount namespace at or
// below dir, as mountinfo spells them: deepest first, and of mounts
// stacked at one point the latest first (the order to unmount them in).
func MountPointsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var mps []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 5 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mps = append([]string{f[4]}, mps...)
		}
	}
	slices.SortStableFunc(mps, func(a, b string) int { return len(b) - len(a) })
	return mps
}

// LoopsUnder lists the loop devices whose backing file is (or was, deleted)
// under dir, each as "loopN: file".
func LoopsUnder(dir string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var loops []string
	for _, p := range files {
		b, err := os.ReadFile(p)
		if s := strings.TrimSpace(string(b)); err == nil && strings.HasPrefix(s, dir+"/") {
			loops = append(loops, filepath.Base(filepath.Dir(filepath.Dir(p)))+": "+s)
		}
	}
	return loops
}
