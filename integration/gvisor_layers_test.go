package integration

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/testutil"
)

// gvisorLayerDirs lists the gvisor backend's layers (checkpoint images)
// on disk: complete ones and, apart, those being made or a crash left.
func gvisorLayerDirs(dataDir string) (complete, temporary []string) {
	var dirs []string
	for _, inst := range dirEntries(filepath.Join(dataDir, "gvisor", "layers")) {
		dirs = append(dirs, filepath.Join(dataDir, "gvisor", "layers", inst))
	}
	return splitLayers(dirs...)
}

// countOf reads the counting loop's /tmp/c, again when it caught the
// loop between the truncation and the write.
func countOf(t *testing.T, e *client.Envd) int {
	t.Helper()
	out := sh(t, e, `for i in 1 2 3 4 5; do c=$(cat /tmp/c 2>/dev/null); [ -n "$c" ] && break; sleep 0.05; done; echo ${c:-0}`)
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("reading /tmp/c: %q", out)
	}
	return n
}

// holdMemory starts a python3 process in the sandbox that holds mb MiB of
// random bytes in its memory, and waits until it does.
func holdMemory(t *testing.T, e *client.Envd, mb int) {
	t.Helper()
	rsh(t, e, `(python3 -c 'import os,time; b=os.urandom(`+strconv.Itoa(mb)+`<<20); open("/tmp/held","w").close(); time.sleep(1e9)' </dev/null >/dev/null 2>&1 &)`)
	eventually(t, 60*time.Second, "the memory to be held", func() bool {
		return rsh(t, e, `test -e /tmp/held && echo yes || true`) == "yes\n"
	})
}

// serveAndCount starts, in a base sandbox, a python3 http.server on port
// 8000 whose page only its files hold, and a shell loop counting in
// /tmp/c, and waits for both.
func serveAndCount(t *testing.T, d *daemon, sb *client.Sandbox) int {
	t.Helper()
	sh(t, sb.Envd(), `mkdir -p /tmp/www && echo served-from-memory > /tmp/www/index.html && cd /tmp/www && (python3 -m http.server 8000 </dev/null >/dev/null 2>&1 &) ; `+
		`(i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.1; done) </dev/null >/dev/null 2>&1 &`)
	eventually(t, 30*time.Second, "the http server to serve", func() bool {
		r := httpOn(t, d, sb, "8000")
		return r.Status == 200 && strings.Contains(string(r.Body), "served-from-memory")
	})
	return countOf(t, sb.Envd())
}

// goesOn checks that sb, booted from a memory checkpoint taken when the
// counter was at least from, runs what the source ran: the http server
// answers and the loop counts on from its value in memory.
func goesOn(t *testing.T, d *daemon, sb *client.Sandbox, from int, what string) {
	t.Helper()
	c := countOf(t, sb.Envd())
	if c < from {
		t.Errorf("%s: counter %d, below %d at the checkpoint: the loop did not go on", what, c, from)
	}
	eventually(t, 30*time.Second, what+": the counter to advance", func() bool { return countOf(t, sb.Envd()) > c })
	if r := httpOn(t, d, sb, "8000"); r.Status != 200 || !strings.Contains(string(r.Body), "served-from-memory") {
		t.Errorf("%s: GET on port 8000 = %d %q, want the page served before the checkpoint", what, r.Status, r.Body)
	}
}

// TestGvisorSnapshotsAndForksKeepMemory proves that on the gvisor backend
// snapshots, forks and checkpoints keep memory and running processes: a
// python3 http.server and a counting shell loop started in the parent run
// on in a sandbox created from a snapshot, in each of three forks, and
// after a rewind; forks are independent (a file or a process in one is in
// no other and not in the parent); deleting a snapshot leaves the
// sandboxes made from it running; diffs answer a clear 400. The parent is
// picked per create (metadata fence.backend) on a native-default daemon.
// Root: namespaces, cgroups, runsc.
func TestGvisorSnapshotsAndForksKeepMemory(t *testing.T) {
	testutil.RequireRunsc(t)
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	parent := d.create(t, api.NewSandbox{TemplateID: "base", Metadata: gvisorMeta, EnvVars: map[string]string{"E": "env", "K": "kept"}})
	c0 := serveAndCount(t, d, parent)

	// Snapshot: the parent runs on; a sandbox made from it goes on.
	start := time.Now()
	snap, err := d.Client.CreateSnapshot(ctx, parent.ID(), "")
	if err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	t.Logf("snapshot took %v", time.Since(start))
	eventually(t, 30*time.Second, "the parent to count on", func() bool { return countOf(t, parent.Envd()) > c0 })
	start = time.Now()
	// The create's environment and metadata are the new sandbox's, although
	// its agent is the snapshot's, restored with its memory.
	fromSnap := d.create(t, api.NewSandbox{TemplateID: snap.SnapshotID, EnvVars: map[string]string{"E": "over", "N": "new"},
		Metadata: map[string]string{"from": "snap"}})
	t.Logf("create from the snapshot took %v", time.Since(start))
	goesOn(t, d, fromSnap, c0, "sandbox from the snapshot")
	if info, err := d.Client.Get(ctx, fromSnap.ID()); err != nil || info.Metadata["fence.backend"] != "gvisor" || info.Metadata["from"] != "snap" {
		t.Errorf("sandbox from the snapshot: %+v, %v; want metadata fence.backend gvisor (where it runs) and the create's", info, err)
	}
	if got := sh(t, fromSnap.Envd(), `echo $E $K $N`); got != "over kept new\n" {
		t.Errorf("environment of the sandbox from the snapshot: %q, want the create's E and N over the snapshot's K", got)
	}
	// Deleting the snapshot leaves it running; it no longer creates.
	if err := d.Client.DeleteSnapshot(ctx, snap.SnapshotID); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	goesOn(t, d, fromSnap, c0, "sandbox from the deleted snapshot")
	if _, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: snap.SnapshotID}); err == nil {
		t.Errorf("create from a deleted snapshot succeeded")
	}
	// Its image goes with the last sandbox made from it.
	if err := d.Client.Kill(ctx, fromSnap.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the snapshot's image to go", func() bool {
		complete, tmp := gvisorLayerDirs(d.DataDir)
		return len(complete)+len(tmp) == 0
	})

	// Three forks, each its own.
	c1 := countOf(t, parent.Envd())
	start = time.Now()
	forks, errs, err := d.Client.Fork(ctx, parent.ID(), 3, time.Minute)
	if err != nil {
		t.Fatalf("Fork: %v", err)
	}
	t.Logf("fork of 3 took %v", time.Since(start))
	for i, f := range forks {
		if errs[i] != nil {
			t.Fatalf("fork %d: %v", i, errs[i])
		}
		t.Cleanup(func() { d.Client.Kill(context.Background(), f.ID()) })
	}
	tokens := map[string]bool{parent.EnvdAccessToken: true}
	for i, f := range forks {
		goesOn(t, d, f, c1, "fork")
		if tokens[f.EnvdAccessToken] {
			t.Errorf("fork %d shares an envd token", i)
		}
		tokens[f.EnvdAccessToken] = true
		info, err := d.Client.Get(ctx, f.ID())
		if err != nil || info.Metadata["fence.backend"] != "gvisor" {
			t.Errorf("fork %d: %+v, %v; want metadata fence.backend gvisor", i, info, err)
		}
		if got := sh(t, f.Envd(), `echo $E; hostname`); got != "env\n"+f.ID()+"\n" {
			t.Errorf("fork %d: env and hostname %q", i, got)
		}
	}
	sh(t, forks[0].Envd(), `echo mine > /tmp/www/index.html; (sleep 3003 </dev/null >/dev/null 2>&1 &)`)
	for i, s := range []*client.Sandbox{parent, forks[1], forks[2]} {
		if r := httpOn(t, d, s, "8000"); strings.Contains(string(r.Body), "mine") {
			t.Errorf("sandbox %d serves fork 0's write", i)
		}
		if out := sh(t, s.Envd(), `ps -eo args | grep -c '[s]leep 3003' || true`); strings.TrimSpace(out) != "0" {
			t.Errorf("sandbox %d sees fork 0's process", i)
		}
	}
	if r := httpOn(t, d, forks[0], "8000"); !strings.Contains(string(r.Body), "mine") {
		t.Errorf("fork 0 does not serve its own write: %d %q", r.Status, r.Body)
	}

	// Checkpoint and rewind: processes come back as they were.
	c2 := countOf(t, parent.Envd())
	cp, err := d.Client.Checkpoint(ctx, parent.ID(), "warm")
	if err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	sh(t, parent.Envd(), `pkill -f '[h]ttp.server'; pkill -f '[w]hile :'; echo gone > /tmp/www/index.html; true`)
	if r := httpOn(t, d, parent, "8000"); r.Status == 200 {
		t.Fatalf("the parent's http server still answers after pkill: %q", r.Body)
	}
	start = time.Now()
	if err := d.Client.Rewind(ctx, parent.ID(), cp.CheckpointID); err != nil {
		t.Fatalf("Rewind: %v", err)
	}
	t.Logf("rewind took %v", time.Since(start))
	goesOn(t, d, parent, c2, "parent after the rewind")
	if _, err := d.Client.Diff(ctx, parent.ID(), "warm", ""); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "not supported on the gvisor backend") {
		t.Errorf("Diff on gvisor = %v, want a 400 saying it is not supported", err)
	}
	if cps, err := d.Client.Checkpoints(ctx, parent.ID()); err != nil || !slices.ContainsFunc(cps, func(c api.Checkpoint) bool { return c.Name == "warm" }) {
		t.Errorf("Checkpoints = %+v, %v", cps, err)
	}
}

// TestGvisorPauseWithoutMemory proves that a pause with memory false on
// the gvisor backend keeps the filesystem and drops the processes: files
// written and removed before the pause are so after the resume, the
// processes started before it are gone (the sandbox booted anew on its
// files), and the ID and token stay. Root: namespaces, cgroups, runsc.
func TestGvisorPauseWithoutMemory(t *testing.T) {
	testutil.RequireRunsc(t)
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	sb := d.create(t, api.NewSandbox{TemplateID: "base", Metadata: gvisorMeta})
	rsh(t, sb.Envd(), `mkdir -p /work && echo kept > /work/a && head -c 3000000 /dev/urandom > /work/big && md5sum /work/big > /work/big.md5 && rm /etc/issue && `+
		`(sleep 3003 </dev/null >/dev/null 2>&1 &)`)
	start := time.Now()
	if err := d.Client.PauseWithoutMemory(ctx, sb.ID()); err != nil {
		t.Fatalf("PauseWithoutMemory: %v", err)
	}
	t.Logf("pause without memory took %v", time.Since(start))
	start = time.Now()
	resumed, err := d.Client.Connect(ctx, sb.ID(), 5*time.Minute)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Logf("resume took %v", time.Since(start))
	if resumed.EnvdAccessToken != sb.EnvdAccessToken {
		t.Errorf("token changed over the pause")
	}
	e := resumed.Envd()
	if got := rsh(t, e, `cat /work/a; md5sum -c /work/big.md5 >/dev/null && echo big-ok; test -e /etc/issue && echo issue-back; ps -eo args | grep -c '[s]leep 3003' || true`); got != "kept\nbig-ok\n0\n" {
		t.Errorf("after the resume: %q, want the files kept and no process of before", got)
	}
	if _, err := os.Stat(filepath.Join(templatesDir(t), "base", "rootfs", "etc", "issue")); err != nil {
		t.Errorf("the template lost /etc/issue: %v", err)
	}
	// Pausing again works on a sandbox booted on its files.
	if err := d.Client.PauseWithoutMemory(ctx, sb.ID()); err != nil {
		t.Fatalf("second PauseWithoutMemory: %v", err)
	}
	if _, err := d.Client.Connect(ctx, sb.ID(), 5*time.Minute); err != nil {
		t.Fatalf("second Connect: %v", err)
	}
	if got := rsh(t, e, `cat /work/a`); got != "kept\n" {
		t.Errorf("after the second pause: %q", got)
	}
}

// TestGvisorLayersCrashConsistency kills the daemon with SIGKILL while a
// gvisor snapshot or fork is being written (a sandbox with ~100 MB of
// memory in use, so that the checkpoint takes a while) and checks the next
// start: no partial image is left or used, the layers on disk are exactly
// the recorded snapshots', a snapshot recorded before the crash still
// boots with its memory (the counting loop goes on), and nothing of the
// crashed run's sandboxes remains. Root: namespaces, cgroups, runsc.
func TestGvisorLayersCrashConsistency(t *testing.T) {
	testutil.RequireRunsc(t)
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	for _, op := range []string{"snapshot", "fork"} {
		t.Run(op, func(t *testing.T) {
			// Not d.create: its cleanup would use the crashed daemon's URL.
			sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "base", Metadata: gvisorMeta})
			if err != nil {
				t.Fatal(err)
			}
			holdMemory(t, sb.Envd(), 100)
			rsh(t, sb.Envd(), `(i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.1; done) </dev/null >/dev/null 2>&1 &`)
			kept, err := d.Client.CreateSnapshot(ctx, sb.ID(), "")
			if err != nil {
				t.Fatal(err)
			}
			before := countOf(t, sb.Envd())
			// Crash as soon as the image is being written.
			crashDuring(t, d, op, func() error {
				var err error
				switch op {
				case "snapshot":
					_, err = d.Client.CreateSnapshot(ctx, sb.ID(), "")
				case "fork":
					_, _, err = d.Client.Fork(ctx, sb.ID(), 3, time.Minute)
				}
				return err
			}, func() bool {
				_, tmp := gvisorLayerDirs(d.DataDir)
				return len(tmp) > 0
			})
			checkLayersAfterCrash(t, d, func() ([]string, []string) { return gvisorLayerDirs(d.DataDir) }, 0, kept.SnapshotID, func(b *client.Sandbox) {
				c := countOf(t, b.Envd())
				eventually(t, 30*time.Second, "the restored loop to count", func() bool { return countOf(t, b.Envd()) > c })
				t.Logf("a snapshot's counter %d, %d when the kept one was taken", c, before)
			})
			if _, err := d.Client.Get(ctx, sb.ID()); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("sandbox after restart: %v, want not found", err)
			}
			eventually(t, 10*time.Second, "no layer and no sandbox directory left", func() bool {
				complete, tmp := gvisorLayerDirs(d.DataDir)
				left := 0
				for _, inst := range dirEntries(filepath.Join(d.DataDir, "gvisor", "sandboxes")) {
					left += len(dirEntries(filepath.Join(d.DataDir, "gvisor", "sandboxes", inst)))
				}
				return len(complete)+len(tmp)+left == 0
			})
		})
	}
}
