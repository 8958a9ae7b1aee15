package gvisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestBenchGvisor measures (and reports; it asserts nothing about time)
// create → exec `true` → kill on the gvisor backend next to native and to
// `runsc run` of /bin/true directly, and pause/resume on gvisor next to
// `runsc checkpoint` / `runsc restore` of a sandbox directly. It runs only
// with FENCE_BENCH=1 (it takes a minute of the shared CPUs):
//
//	FENCE_BENCH=1 go test -run TestBenchGvisor -v ./internal/isolation/gvisor/
func TestBenchGvisor(t *testing.T) {
	if os.Getenv("FENCE_BENCH") != "1" {
		t.Skip("set FENCE_BENCH=1 to run the gvisor benchmark")
	}
	runsc := testutil.RequireRunsc(t)
	rootfs := testutil.RootFS(t, "minimal")
	n := 6
	dir := filepath.Join(testutil.StateDir(t), "state")
	gv := newBackendIn(t, dir)
	nb, err := native.New(t.Context(), native.Options{StateDir: filepath.Join(testutil.StateDir(t), "native"),
		Instance: "benchgv", Executable: testutil.FenceBinary(t), Network: isolationtest.Network(nil)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nb.Cleanup(context.Background()); nb.Close() })

	cycle := func(b isolation.Backend) func() error {
		return func() error {
			s, err := b.Create(t.Context(), isolation.Spec{RootFS: rootfs})
			if err != nil {
				return err
			}
			if _, code, err := isolationtest.Exec(t.Context(), s, "true"); err != nil || code != 0 {
				s.Kill(t.Context())
				return fmt.Errorf("exec true: %d, %v", code, err)
			}
			return s.Kill(t.Context())
		}
	}
	report(t, "native create→exec→kill", n, cycle(nb))
	report(t, "gvisor create→exec→kill", n, cycle(gv))

	// runsc directly: the same template, /bin/true, no network.
	bundle := t.TempDir()
	writeBundle(t, bundle, rootfs, []string{"/bin/true"})
	root := t.TempDir()
	t.Cleanup(func() {
		for unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH) == nil {
		}
		for _, d := range must(filepath.Glob("/sys/fs/cgroup/*/fence/benchrunsc")) {
			unix.Rmdir(d)
		}
	})
	i := 0
	report(t, "runsc run /bin/true (direct)", n, func() error {
		i++
		return runscCmd(runsc, root, "run", "--bundle", bundle, fmt.Sprintf("b%d", i))
	})

	// Pause and resume of a gvisor sandbox running a loop.
	s, err := gv.Create(t.Context(), isolation.Spec{RootFS: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Kill(context.WithoutCancel(t.Context()))
	isolationtest.Exec(t.Context(), s, "sh", "-c", "(while :; do sleep 0.1; done) </dev/null >/dev/null 2>&1 &")
	p := s.(isolation.Pauser)
	var pauses, resumes []time.Duration
	n = 4
	for range n {
		t0 := time.Now()
		if err := p.Pause(t.Context()); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if err := p.Resume(t.Context()); err != nil {
			t.Fatal(err)
		}
		pauses, resumes = append(pauses, t1.Sub(t0)), append(resumes, time.Since(t1))
	}
	t.Logf("gvisor Pause (checkpoint): median %v over %d", median(pauses), n)
	t.Logf("gvisor Resume (restore, agent answering): median %v over %d", median(resumes), n)

	// runsc checkpoint and restore directly, the same loop.
	lb := t.TempDir()
	writeBundle(t, lb, rootfs, []string{"/bin/sh", "-c", "while :; do sleep 0.1; done"})
	if err := runscCmd(runsc, root, "run", "--detach", "--bundle", lb, "loop"); err != nil {
		t.Fatal(err)
	}
	defer runscCmd(runsc, root, "delete", "--force", "loop")
	var cps, rss []time.Duration
	for k := range n {
		img := filepath.Join(t.TempDir(), fmt.Sprint(k))
		t0 := time.Now()
		if err := runscCmd(runsc, root, "checkpoint", "--image-path", img, "loop"); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		runscCmd(runsc, root, "delete", "--force", "loop")
		t2 := time.Now()
		if err := runscCmd(runsc, root, "restore", "--detach", "--bundle", lb, "--image-path", img, "loop"); err != nil {
			t.Fatal(err)
		}
		cps, rss = append(cps, t1.Sub(t0)), append(rss, time.Since(t2))
	}
	t.Logf("runsc checkpoint (direct): median %v over %d", median(cps), n)
	t.Logf("runsc restore (direct): median %v over %d", median(rss), n)
}

func report(t *testing.T, what string, n int, fn func() error) {
	t.Helper()
	if err := fn(); err != nil { // warm-up
		t.Fatalf("%s: %v", what, err)
	}
	var ds []time.Duration
	for range n {
		t0 := time.Now()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		ds = append(ds, time.Since(t0))
	}
	t.Logf("%s: median %v over %d", what, median(ds), n)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// runscCmd runs runsc with its output in a file: a detached sandbox keeps
// its stdio, and a pipe would hold the command until the sandbox ends.
func runscCmd(runsc, root string, args ...string) error {
	out, err := os.CreateTemp("", "runsc-out-")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.Command(runsc, append([]string{"--root", root, "--platform", "systrap", "--network", "none"}, args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		msg, _ := os.ReadFile(out.Name())
		return fmt.Errorf("runsc %s: %w: %s", args[0], err, strings.TrimSpace(string(msg)))
	}
	return nil
}

func writeBundle(t *testing.T, dir, rootfs string, args []string) {
	t.Helper()
	spec := specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{Args: args, Cwd: "/", Env: []string{"PATH=/bin:/usr/bin"}},
		Root:    &specs.Root{Path: rootfs, Readonly: true},
		Mounts:  []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux: &specs.Linux{CgroupsPath: "/fence/benchrunsc/" + filepath.Base(dir), Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.NetworkNamespace}}},
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

func must[T any](v T, _ error) T { return v }
