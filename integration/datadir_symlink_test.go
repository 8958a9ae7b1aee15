package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestSymlinkedDataDirRestarts runs `fence serve --data-dir LINK`, LINK a
// symlink to the real data dir (an operator's /var/lib/fence on a bigger
// disk) that holds the templates too (LINK/templates), five times in a row with a warm pool filling, each run ended by
// SIGTERM or by SIGKILL in turn (runs 1 and 3 are killed, the last one is
// stopped cleanly). Each start must find exactly one mount of the native
// disk dir (its own, not one more per earlier run), and each run creates,
// execs in and kills a sandbox on the native backend and, where runsc is
// installed, on gVisor: per create on a native daemon in runs 0 to 3, and
// as the daemon's default (--backend gvisor) in the last run. After the
// last clean stop, no mount under the data dir (as the kernel names it)
// and no loop device backed by a file under it is left. Root: namespaces,
// cgroups, mounts, loop devices.
func TestSymlinkedDataDirRestarts(t *testing.T) {
	testutil.RequireRoot(t)
	requireTemplate(t, "minimal")
	gvisor := true
	if _, err := os.Stat(runscPath()); err != nil {
		if testutil.InCI() {
			testutil.RequireRunsc(t)
		}
		gvisor = false
		t.Logf("no runsc at %s: the gVisor sandboxes are left out", runscPath())
	}
	state := testutil.StateDir(t)
	real := filepath.Join(state, "bigdisk", "fence")
	if err := os.MkdirAll(real, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(real), 0o711); err != nil {
		t.Fatal(err)
	}
	if r, err := filepath.EvalSymlinks(real); err != nil {
		t.Fatal(err)
	} else {
		real = r
	}
	link := filepath.Join(state, "data")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	// The templates live in the data dir, as by default: every template
	// root is reached through the symlink too.
	if err := os.Mkdir(filepath.Join(real, "templates"), 0o700); err != nil {
		t.Fatal(err)
	}
	src := filepath.Dir(testutil.RootFS(t, "minimal"))
	if out, err := exec.Command("cp", "-a", src, filepath.Join(real, "templates", "minimal")).CombinedOutput(); err != nil {
		t.Fatalf("copying the template: %v: %s", err, out)
	}
	t.Cleanup(func() { unmountUnder(real) })
	diskDir := filepath.Join(real, "native", "disk", instanceOf(link))
	nativeMeta := map[string]string{"fence.backend": "native"}

	d := startDaemon(t, link, "--warm-pool", "2", "--templates-dir", filepath.Join(link, "templates"))
	const runs = 5
	for run := range runs {
		last := run == runs-1
		if run > 0 {
			if last && gvisor {
				d.extra = append(d.extra, "--backend", "gvisor")
			}
			d.Restart()
		}
		if n := mountsAt(diskDir); n != 1 {
			t.Errorf("run %d: %d mounts at %s after the start, want 1 (the daemon's own)", run, n, diskDir)
		}
		eventually(t, 60*time.Second, "a warm sandbox ready", func() bool {
			return metricValue(t, d, "fence_sandboxes_warm_ready") >= 1
		})
		switch {
		case last && gvisor:
			createExecKill(t, d, run, "gvisor (the default)", nil)
			createExecKill(t, d, run, "native", nativeMeta)
		case gvisor:
			createExecKill(t, d, run, "native (the default)", nil)
			createExecKill(t, d, run, "gvisor", gvisorMeta)
		default:
			createExecKill(t, d, run, "native (the default)", nil)
		}
		if run%2 == 1 {
			t.Logf("run %d: killed with SIGKILL", run)
			d.Crash()
		} else {
			t.Logf("run %d: stopped with SIGTERM", run)
			d.Stop()
		}
	}
	assertNoLeftovers(t, real, d.sandboxIDs())
	if m := mountsUnder(real); len(m) > 0 {
		t.Errorf("after the last clean stop, %d mounts under %s remain:\n%s", len(m), real, strings.Join(m, "\n"))
	}
	// A loop device detaches once its last mount is gone, which the kernel
	// may finish a moment after the daemon exits.
	deadline := time.Now().Add(15 * time.Second)
	for loops := testutil.LoopsUnder(real); len(loops) > 0; loops = testutil.LoopsUnder(real) {
		if time.Now().After(deadline) {
			t.Errorf("after the last clean stop, %d loop devices are backed by files under %s:\n%s", len(loops), real, strings.Join(loops, "\n"))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runscPath is the runsc the gvisor backend uses in tests.
func runscPath() string {
	if p := os.Getenv("FENCE_RUNSC"); p != "" {
		return p
	}
	return "/var/lib/fence/cache/runsc/runsc"
}

// createExecKill creates a minimal sandbox with meta (which picks its
// backend), runs a command in it and kills it, reporting failures as
// errors of run.
func createExecKill(t *testing.T, d *daemon, run int, backend string, meta map[string]string) {
	t.Helper()
	ctx := ctxT(t)
	sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "minimal", Metadata: meta})
	if err != nil {
		t.Errorf("run %d: create on %s: %v", run, backend, err)
		return
	}
	if out := sh(t, sb.Envd(), "echo exec-$((6*7))"); strings.TrimSpace(out) != "exec-42" {
		t.Errorf("run %d: exec on %s printed %q, want exec-42", run, backend, out)
	}
	if err := d.Client.Kill(ctx, sb.ID()); err != nil {
		t.Errorf("run %d: kill on %s: %v", run, backend, err)
	}
}

// mountsAt counts the mounts stacked at mountPoint (a path as mountinfo
// spells it).
func mountsAt(mountPoint string) int {
	n := 0
	for _, m := range mountsUnder(mountPoint) {
		if f := strings.Fields(m); len(f) >= 5 && f[4] == mountPoint {
			n++
		}
	}
	return n
}
