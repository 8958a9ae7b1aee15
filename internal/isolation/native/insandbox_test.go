package native_test

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/insandbox/embedded"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/testutil"
)

// A fence binary built with scripts/build.sh carries the in-sandbox binary,
// and its sandboxes run that one (init, and the agent at /.fence/fence),
// not the daemon's binary with everything the daemon links.
func TestSandboxRunsInSandboxBinary(t *testing.T) {
	testutil.RequireRoot(t)
	exe := testutil.FenceBinary(t)
	dir := filepath.Join(testutil.StateDir(t), "bin")
	want, err := embedded.Resolve(t.Context(), exe, dir)
	if err != nil {
		t.Fatal(err)
	}
	if want == exe {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s carries no in-sandbox binary: CI builds it with scripts/build.sh", exe)
		}
		t.Skipf("%s carries no in-sandbox binary (built without scripts/build.sh)", exe)
	}
	// Extracting again finds the same file and leaves it as it is.
	again, err := embedded.Resolve(t.Context(), exe, dir)
	if err != nil || again != want {
		t.Fatalf("second Resolve = %q, %v; want %q", again, err, want)
	}
	st, err := os.Stat(want)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o555 {
		t.Errorf("%s has mode %v, want 0555", want, st.Mode().Perm())
	}
	exeSt, err := os.Stat(exe)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() >= exeSt.Size()/2 {
		t.Errorf("in-sandbox binary %d bytes, fence %d: want it much smaller", st.Size(), exeSt.Size())
	}
	raw, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)

	b := newBackend(t)
	sb := create(t, b, isolation.Spec{RootFS: testutil.RootFS(t, "minimal")})
	r := run(t, sb, "root", "sha256sum", "/.fence/fence")
	if r.exit != 0 {
		t.Fatalf("sha256sum /.fence/fence: exit %d: %s", r.exit, r.stderr)
	}
	got, _, _ := strings.Cut(r.stdout, " ")
	if got != hex.EncodeToString(sum[:]) {
		t.Fatalf("/.fence/fence in the sandbox has SHA-256 %s, want the in-sandbox binary's %x", got, sum)
	}
	// So is the spawner, which every init's clone copies (its memory,
	// page by page), on one P (sysmon then sleeps while the spawner waits
	// in a system call, instead of polling every 20 µs).
	spawner := b.SpawnerPid()
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", spawner)); err != nil || filepath.Base(exe) != filepath.Base(want) {
		t.Errorf("the spawner runs %q (%v), want the in-sandbox binary (%s)", exe, err, filepath.Base(want))
	}
	if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", spawner)); err != nil || !slices.Contains(strings.Split(string(env), "\x00"), "GOMAXPROCS=1") {
		t.Errorf("the spawner's environment %q (%v) lacks GOMAXPROCS=1", env, err)
	}
	// fence's sudo is the in-sandbox binary too.
	if r := run(t, sb, "root", "sudo", "-n", "true"); r.exit != 0 {
		t.Fatalf("sudo true: exit %d: %s", r.exit, r.stderr)
	}
	// On linux/amd64 it starts at its own entry point, which bounds an
	// init's capabilities before the Go runtime starts a thread.
	if runtime.GOARCH == "amd64" {
		f, err := elf.Open(want)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		syms, err := f.Symbols()
		if err != nil {
			t.Fatal(err)
		}
		entry := ""
		for _, s := range syms {
			if s.Value == f.Entry && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
				entry = s.Name
			}
		}
		if entry != "_fence_sandbox_rt0" {
			t.Errorf("the in-sandbox binary starts at %q (%#x), want _fence_sandbox_rt0: scripts/build.sh links it with -E", entry, f.Entry)
		}
	}
}
