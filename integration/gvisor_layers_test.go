package integration

import (
	"context"
	"errors"
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
	insts := dirEntries(filepath.Join(dataDir, "gvisor", "layers"))
	for _, inst := range insts {
		for _, n := range dirEntries(filepath.Join(dataDir, "gvisor", "layers", inst)) {
			if strings.HasPrefix(n, ".tmp-") {
				temporary = append(temporary, n)
			} else {
				complete = append(complete, n)
			}
		}
	}
	return complete, temporary
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
	parent := d.create(t, api.NewSandbox{TemplateID: "base", Metadata: gvisorMeta, EnvVars: map[string]string{"E": "env"}})
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
	fromSnap := d.create(t, api.NewSandbox{TemplateID: snap.SnapshotID})
	t.Logf("create from the snapshot took %v", time.Since(start))
	goesOn(t, d, fromSnap, c0, "sandbox from the snapshot")
	if info, err := d.Client.Get(ctx, fromSnap.ID()); err != nil || info.TemplateID != strings.TrimSuffix(snap.SnapshotID, ":default") && info.TemplateID != snap.SnapshotID {
		t.Logf("sandbox from the snapshot: %+v, %v", info, err)
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
