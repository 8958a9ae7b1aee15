package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/selftest"
	"github.com/fencesandbox/fence/internal/selftest/probe"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestSelftest runs `fence selftest` as an operator would: every check
// must PASS in the sandbox fence run makes on this machine, the exit
// status must be 0, and the sandbox must be gone afterwards. A template
// that is not built and a caller who is not root are setup errors (exit
// 2) that say what to do. Root: the selftest creates the sandbox's
// namespaces, cgroups and mounts itself.
func TestSelftest(t *testing.T) {
	testutil.RequireRoot(t)
	dataDir := newDataDir(t)
	tdir := templatesDir(t)
	n := len(probe.Checks())

	start := time.Now()
	out, errs, code := runFence(t, nil, nil, "selftest", "--data-dir", dataDir, "--templates-dir", tdir)
	t.Logf("fence selftest took %v:\n%s", time.Since(start), out)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) != n+1 || lines[n] != strconv.Itoa(n)+" passed, 0 failed" {
		t.Fatalf("fence selftest: exit %d, stderr %q, %d lines; want exit 0, %d PASS lines and the summary", code, errs, len(lines), n)
	}
	for i, c := range probe.Checks() {
		if !strings.HasPrefix(lines[i], "PASS "+c.Name+" — ") {
			t.Errorf("line %d = %q, want PASS %s", i, lines[i], c.Name)
		}
	}
	for _, name := range []string{"egress", "egress-host"} {
		if !strings.Contains(out, "PASS "+name+" — ") || !strings.Contains(lines[indexOf(name)], "refused by fence:") {
			t.Errorf("%s passed without fence's refusal on record: %q", name, lines[indexOf(name)])
		}
	}
	assertRunsLeftNothing(t, dataDir)

	t.Run("json, base template", func(t *testing.T) {
		requireTemplate(t, "base")
		out, errs, code := runFence(t, nil, nil, "selftest", "--json", "--template", "base", "--data-dir", dataDir, "--templates-dir", tdir)
		var rep selftest.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 || !rep.OK() || rep.Passed != n {
			t.Fatalf("fence selftest --json --template base: exit %d, %v, stderr %q, report:\n%s", code, err, errs, out)
		}
		assertRunsLeftNothing(t, dataDir)
	})
	t.Run("template not built", func(t *testing.T) {
		out, errs, code := runFence(t, nil, nil, "selftest", "--template", "nosuch", "--data-dir", dataDir, "--templates-dir", tdir)
		if code != 2 || out != "" || !strings.Contains(errs, "fence template build nosuch") {
			t.Errorf("fence selftest --template nosuch: exit %d, stdout %q, stderr %q; want 2 and how to build it", code, out, errs)
		}
	})
	t.Run("not root", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		bin := testutil.FenceBinary(t)
		cmd := exec.CommandContext(ctx, bin, "selftest", "--data-dir", dataDir, "--templates-dir", tdir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("fence selftest as nobody: %v (stderr %q); want it to run and exit 2", err, stderr.String())
		}
		if ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "must run as root") {
			t.Errorf("fence selftest as nobody: exit %d, stderr %q; want 2 and \"must run as root\"", ee.ExitCode(), stderr.String())
		}
	})
}

func indexOf(name string) int {
	for i, c := range probe.Checks() {
		if c.Name == name {
			return i
		}
	}
	return -1
}

// assertRunsLeftNothing checks that the one-off sandboxes of fence run and
// fence selftest on dataDir left no state, writable layer, sandbox cgroup
// or mount behind.
func assertRunsLeftNothing(t *testing.T, dataDir string) {
	t.Helper()
	native := filepath.Join(dataDir, "native")
	for _, sub := range []string{"sandboxes", "sock", "disk", "images"} {
		for _, inst := range dirEntries(filepath.Join(native, sub)) {
			if names := dirEntries(filepath.Join(native, sub, inst)); len(names) > 0 {
				t.Errorf("left behind: %s/%s/%s holds %q", native, sub, inst, names)
			}
		}
	}
	for _, inst := range dirEntries(filepath.Join(native, "sandboxes")) {
		if cgs := sandboxCgroups(inst); len(cgs) > 0 {
			t.Errorf("left behind: sandbox cgroups under fence/%s: %q", inst, cgs)
		}
	}
	if m := mountsUnder(dataDir); len(m) > 0 {
		t.Errorf("left behind: mounts under %s:\n%s", dataDir, strings.Join(m, "\n"))
	}
}
