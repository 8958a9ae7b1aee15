package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/testutil"
)

// TestBenchSmoke runs `fence bench` with a few iterations, the peers and a
// small density run, so that the benchmark keeps working. It asserts that
// every measure ran and reported, never how fast.
func TestBenchSmoke(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	dataDir := newDataDir(t)
	t.Cleanup(func() { unmountUnder(dataDir) })
	benchMounts := func() int {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		return strings.Count(string(b), "/fence-bench-")
	}
	mountsBefore := benchMounts()
	cmd := exec.Command(testutil.FenceBinary(t), "bench", "--iterations", "3", "--peers", "--density", "12", "--net-mib", "16",
		"--data-dir", dataDir, "--templates-dir", filepath.Dir(filepath.Dir(rootfs)))
	out, err := cmd.CombinedOutput()
	t.Logf("fence bench:\n%s", out)
	if err != nil {
		t.Fatalf("fence bench: %v", err)
	}
	for _, want := range []string{
		"vs bwrap (median)", "fence create→exec true→kill ", "phase: create", "phase: exec true (sandbox CPU ", "phase: kill",
		"warm pool", "exec true in a running sandbox", "runc run /bin/true",
		"fence pause (100 MiB in use)", "fence resume (100 MiB in use)",
		"api create→run echo→kill, minimal", "api create→run echo→kill, minimal (warm pool)",
		"run: to the start event", "run: start to first output", "run: output to the end", "HTTP dials per round trip",
		"api exec true in a running sandbox", "(beside the api exec)", "density: 12 idle minimal sandboxes",
		"exec true in every sandbox: 12 of 12 answered", "idle sandbox memory",
		"bwrap /bin/true with none alive", "threads on the host:", "machine CPU time with the 12 idle:",
		"of which the daemon ", "; the busiest other commands ", "the kernel's pivot_root with none alive ",
		"bulk download of 16 MiB: sandbox", "new connection (connect, 1 byte, close), p50: sandbox",
		"phase: teardown (after kill answered)", "ratios in this run (medians):",
		"a cold create, step by step (", "init: capabilities, no_new_privs, seccomp ",
		"teardown of a cold cycle's sandbox (after kill answered), mean of ",
		"fence create→exec true→kill / bwrap /bin/true:", "baseline fork+exec /bin/true ",
		"fence exec true in a running sandbox / baseline fork+exec /bin/true:", "DNS lookup of an allowed name, cached, p50: sandbox",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("fence bench output lacks %q", want)
		}
	}
	if strings.Contains(string(out), "failed") {
		t.Errorf("fence bench reported a failed measure")
	}
	// Its daemons kept their log, which a failed measure quotes.
	if log, err := os.ReadFile(filepath.Join(dataDir, "bench-daemon.log")); err != nil || !strings.Contains(string(log), `msg="sandbox created"`) {
		t.Errorf("the benchmark daemons' log (%v) lacks their creates:\n%s", err, log)
	}
	assertNoSandboxLeftovers(t, filepath.Join(dataDir, "bench-api"), map[string]bool{}, nil)
	// The peers leave nothing mounted either (runsc's network namespace
	// pin in its state directory did).
	if after := benchMounts(); after > mountsBefore {
		t.Errorf("fence bench left %d mounts in its work directory", after-mountsBefore)
	}
}
