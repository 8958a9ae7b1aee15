package integration

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// TestLifecycle proves the control plane's lifecycle through the real
// daemon: create, get, list by metadata, timeout, kill, and that a killed
// sandbox is gone from every view. Root: the daemon creates namespaces,
// cgroups and mounts.
func TestLifecycle(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	tag := randHex(6)
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal", Metadata: map[string]string{"suite": tag, "k": "v w&x=y"}})
	if sb.SandboxID == "" || sb.EnvdAccessToken == "" {
		t.Fatalf("Create = %+v, want an ID and an envd access token", sb.Sandbox)
	}

	got, err := d.Client.Get(ctx, sb.ID())
	if err != nil {
		t.Fatalf("Get(%s): %v", sb.ID(), err)
	}
	if got.SandboxID != sb.ID() || got.State != "running" || got.Metadata["suite"] != tag || got.Metadata["k"] != "v w&x=y" {
		t.Errorf("Get(%s) = %+v, want running with metadata suite=%s, k=%q", sb.ID(), got.ListedSandbox, tag, "v w&x=y")
	}
	if got.TemplateID == "" {
		t.Errorf("Get(%s).TemplateID is empty", sb.ID())
	}

	// A second sandbox, with other metadata, must not match the filter.
	other := d.create(t, api.NewSandbox{TemplateID: "minimal", Metadata: map[string]string{"suite": "other-" + tag}})
	list, err := d.Client.List(ctx, client.ListOptions{Metadata: map[string]string{"suite": tag}})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if ids := listedIDs(list); !slices.Equal(ids, []string{sb.ID()}) {
		t.Errorf("List(suite=%s) = %q, want [%s]", tag, ids, sb.ID())
	}
	list, err = d.Client.List(ctx, client.ListOptions{Metadata: map[string]string{"suite": tag, "k": "v w&x=y"}})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if ids := listedIDs(list); !slices.Equal(ids, []string{sb.ID()}) {
		t.Errorf("List(suite, k with special characters) = %q, want [%s]", ids, sb.ID())
	}
	all, err := d.Client.List(ctx, client.ListOptions{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if ids := listedIDs(all); !slices.Contains(ids, sb.ID()) || !slices.Contains(ids, other.ID()) {
		t.Errorf("List() = %q, want both %s and %s", ids, sb.ID(), other.ID())
	}

	// SetTimeout moves endAt; a shorter timeout moves it back.
	if err := d.Client.SetTimeout(ctx, sb.ID(), time.Hour); err != nil {
		t.Fatalf("SetTimeout(1h): %v", err)
	}
	long, err := d.Client.Get(ctx, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Client.SetTimeout(ctx, sb.ID(), time.Minute); err != nil {
		t.Fatalf("SetTimeout(1m): %v", err)
	}
	short, err := d.Client.Get(ctx, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	if diff := long.EndAt.Sub(short.EndAt); diff < 50*time.Minute || diff > 70*time.Minute {
		t.Errorf("endAt after SetTimeout(1h) - after SetTimeout(1m) = %v, want about 59m", diff)
	}
	if !short.EndAt.After(short.StartedAt) {
		t.Errorf("endAt %v is not after startedAt %v", short.EndAt, short.StartedAt)
	}
	if err := d.Client.SetTimeout(ctx, "nosuchsandbox", time.Minute); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("SetTimeout(unknown) = %v, want not found", err)
	}

	// Kill: gone from Get and List, a second kill is not found.
	if err := d.Client.Kill(ctx, sb.ID()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if _, err := d.Client.Get(ctx, sb.ID()); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get after Kill = %v, want not found (404)", err)
	}
	list, err = d.Client.List(ctx, client.ListOptions{Metadata: map[string]string{"suite": tag}})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(list) != 0 {
		t.Errorf("List(suite=%s) after Kill = %q, want none", tag, listedIDs(list))
	}
	if err := d.Client.Kill(ctx, sb.ID()); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("second Kill = %v, want not found", err)
	}
	// Sandbox traffic to the killed sandbox is refused.
	if _, err := sb.Envd().Stat(ctx, "/"); err == nil {
		t.Errorf("Stat in a killed sandbox succeeded")
	}
	// Its host resources (cgroup, state, writable layer, mounts) are
	// released right after the kill answered, while the daemon still runs.
	assertNoSandboxLeftovers(t, d.DataDir, map[string]bool{sb.ID(): true}, map[string]bool{other.ID(): true})
}

func listedIDs(l []api.ListedSandbox) []string {
	var ids []string
	for _, s := range l {
		ids = append(ids, s.SandboxID)
	}
	slices.Sort(ids)
	return ids
}

// TestRunCLI proves `fence run`: output, exit codes, binds (read-write and
// read-only) and the refusal of dangerous binds, without a daemon, and that
// a run leaves no cgroup or state behind. Root: `fence run` creates the
// sandbox's namespaces, cgroups and mounts itself.
func TestRunCLI(t *testing.T) {
	dataDir := newDataDir(t)
	tdir := templatesDir(t)
	fenceRun := func(t *testing.T, args ...string) (string, string, int) {
		t.Helper()
		return runFence(t, nil, nil, append([]string{"run", "--data-dir", dataDir, "--templates-dir", tdir}, args...)...)
	}
	t.Run("python", func(t *testing.T) {
		requireTemplate(t, "base")
		out, errs, code := fenceRun(t, "--template", "base", "--", "python3", "-c", "print(6*7)")
		if out != "42\n" || code != 0 {
			t.Errorf("fence run --template base -- python3 -c 'print(6*7)' = %q, exit %d (stderr %q), want \"42\\n\", exit 0", out, code, errs)
		}
	})
	t.Run("cgroup namespace", func(t *testing.T) {
		// The sandbox's cgroup namespace is rooted at its own cgroups: no
		// hierarchy shows the host's tree (fence/run-PID/ID or /../..).
		out, errs, code := fenceRun(t, "--", "cat", "/proc/self/cgroup")
		if code != 0 || out == "" {
			t.Fatalf("fence run -- cat /proc/self/cgroup: exit %d, stdout %q, stderr %q", code, out, errs)
		}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.SplitN(l, ":", 3); len(f) != 3 || f[2] != "/" {
				t.Errorf("/proc/self/cgroup in fence run: %q, want every hierarchy at /", l)
			}
		}
	})
	t.Run("exit codes", func(t *testing.T) {
		for _, want := range []int{0, 1, 7, 255} {
			_, errs, code := fenceRun(t, "--", "sh", "-c", "exit "+strconv.Itoa(want))
			if code != want {
				t.Errorf("fence run -- sh -c 'exit %d' exited %d (stderr %q)", want, code, errs)
			}
		}
		_, _, code := fenceRun(t, "--", "sh", "-c", "kill -9 $$")
		if code != 128+9 {
			t.Errorf("fence run -- sh -c 'kill -9 $$' exited %d, want 137", code)
		}
	})
	t.Run("bind rw", func(t *testing.T) {
		// A bind's owner is the sandbox's user: what the sandbox writes
		// there lands owned by the directory's owner, whoever that is,
		// and nothing else of the host is writable through it.
		for _, tc := range []struct {
			name  string
			owner int
			user  []string
		}{
			{"developer dir, default user", 1000, nil},
		} {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "in"), []byte("from host\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(dir, tc.owner, tc.owner); err != nil {
				t.Fatal(err)
			}
			args := append(append([]string{}, tc.user...), "-v", dir+":/w", "-w", "/w", "--", "sh", "-c", "cat in && echo hi > out")
			out, errs, code := fenceRun(t, args...)
			if code != 0 || out != "from host\n" {
				t.Errorf("%s: fence run %q = %q, exit %d (stderr %q), want the host file and exit 0", tc.name, args, out, code, errs)
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, "out"))
			if err != nil || string(b) != "hi\n" {
				t.Errorf("%s: DIR/out = %q, %v; want \"hi\\n\"", tc.name, b, err)
			}
			if st, err := os.Stat(filepath.Join(dir, "out")); err == nil {
				if uid := st.Sys().(*syscall.Stat_t).Uid; int(uid) != tc.owner {
					t.Errorf("%s: DIR/out is owned by host uid %d, want %d (binds map uids one to one)", tc.name, uid, tc.owner)
				}
			}
		}
	})
	t.Run("bind plants nothing privileged", func(t *testing.T) {
		// Untrusted code must not leave a set-id program, or a file of
		// root's, in a project directory: the host would run it later.
		dir := t.TempDir()
		if err := os.Chown(dir, 1000, 1000); err != nil {
			t.Fatal(err)
		}
		fenceRun(t, "-v", dir+":/w", "-w", "/w", "--", "sh", "-c", "cp /bin/busybox sh1; chmod u+s sh1; chmod g+s sh1")
		fenceRun(t, "-u", "root", "-v", dir+":/w", "-w", "/w", "--", "sh", "-c", "cp /bin/busybox sh2; chown 0:0 sh1")
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			st, err := os.Lstat(filepath.Join(dir, e.Name()))
			if err != nil {
				continue
			}
			sys := st.Sys().(*syscall.Stat_t)
			if st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || sys.Uid != 1000 {
				t.Errorf("%s in the bound directory: mode %v, owner %d; want no set-id bit and owner 1000", e.Name(), st.Mode(), sys.Uid)
			}
		}
	})
	t.Run("bind of root's, read-only", func(t *testing.T) {
		// Read-only, root's files stay not the user's: a system place
		// such as /etc may be bound so (TestRunBindRootProject proves
		// the writable bind of a root user's project).
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("root only\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "public"), []byte("for all\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, errs, code := fenceRun(t, "-v", dir+":/w:ro", "--", "sh", "-c", "cat /w/public; cat /w/secret; stat -c %u /w/secret")
		if strings.Contains(out, "root only") {
			t.Errorf("the sandbox user read root's 0600 file through a :ro bind: %q", out)
		}
		if !strings.Contains(out, "for all") {
			t.Errorf("fence run -v ROOTDIR:/w:ro cat /w/public = %q (exit %d, stderr %q), want the world-readable file", out, code, errs)
		}
		if strings.Contains(out, "\n1000\n") {
			t.Errorf("root's file appears as the sandbox user's inside: %q", out)
		}
	})
	t.Run("bind ro", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "keep"), []byte("original"), 0o666); err != nil {
			t.Fatal(err)
		}
		_, errs, code := fenceRun(t, "-u", "root", "-v", dir+":/w:ro", "-w", "/w", "--", "sh", "-c", "echo hi > out")
		if code == 0 {
			t.Errorf("writing to a :ro bind succeeded (stderr %q)", errs)
		}
		if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
			t.Errorf("DIR/out after write to :ro bind: %v, want not exist", err)
		}
		_, _, code = fenceRun(t, "-u", "root", "-v", dir+":/w:ro", "--", "sh", "-c", "echo x > /w/keep; rm -f /w/keep")
		if b, _ := os.ReadFile(filepath.Join(dir, "keep")); string(b) != "original" {
			t.Errorf("DIR/keep after write through :ro bind = %q, want unchanged", b)
		}
		if code == 0 {
			t.Errorf("modifying a file in a :ro bind succeeded")
		}
	})
	t.Run("bind refused", func(t *testing.T) {
		for _, spec := range []string{"/:/x", "/proc:/x", "/proc/1:/x", "/sys:/x", "/dev:/x", dataDir + ":/x", filepath.Dir(dataDir) + ":/x"} {
			out, errs, code := fenceRun(t, "-v", spec, "--", "echo", "ran")
			if code == 0 || strings.Contains(out, "ran") {
				t.Errorf("fence run -v %s: exit %d, stdout %q, want refusal", spec, code, out)
				continue
			}
			if !strings.Contains(errs, "bind refused") {
				t.Errorf("fence run -v %s: stderr %q, want a clear refusal", spec, errs)
			}
		}
	})
	// Every run above removed its own sandbox: no run-<pid> instance keeps
	// a sandbox cgroup, state or writable layer.
	native := filepath.Join(dataDir, "native")
	for _, sub := range []string{"sandboxes", "sock", "disk", "images"} {
		for _, inst := range dirEntries(filepath.Join(native, sub)) {
			if names := dirEntries(filepath.Join(native, sub, inst)); len(names) > 0 {
				t.Errorf("after fence run: %s/%s/%s holds %q", native, sub, inst, names)
			}
		}
	}
	var leftParents []string
	for _, inst := range dirEntries(filepath.Join(native, "sandboxes")) {
		if cgs := sandboxCgroups(inst); len(cgs) > 0 {
			t.Errorf("after fence run: sandbox cgroups left under fence/%s: %q", inst, cgs)
		}
		for _, r := range cgroupRoots(inst) {
			if _, err := os.Stat(r); err == nil {
				leftParents = append(leftParents, "fence/"+inst)
				break
			}
		}
	}
	if len(leftParents) > 0 {
		t.Errorf("after fence run: the cgroup parents of %d of %d finished runs remain, e.g. /sys/fs/cgroup/*/%s",
			len(leftParents), len(dirEntries(filepath.Join(native, "sandboxes"))), leftParents[0])
		// Do not let the test pile them up on the host.
		for _, p := range leftParents {
			for _, r := range cgroupRoots(strings.TrimPrefix(p, "fence/")) {
				syscall.Rmdir(r)
			}
		}
	}
	if m := mountsUnder(dataDir); len(m) > 0 {
		t.Errorf("after fence run: mounts under %s remain:\n%s", dataDir, strings.Join(m, "\n"))
	}
}
