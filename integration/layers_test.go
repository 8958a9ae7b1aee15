package integration

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/testutil"
)

// layersDir is where the daemon on dataDir keeps its filesystem layers.
func layersDir(dataDir string) string {
	return filepath.Join(dataDir, "native", "layers", instanceOf(dataDir))
}

// layerDirs lists the layers on disk: complete ones and, apart, the
// temporary ones a copy in progress (or a crash) leaves.
func layerDirs(dataDir string) (complete, temporary []string) {
	return splitLayers(layersDir(dataDir))
}

// splitLayers lists the layers in dirs: complete ones and, apart, those
// being made or deleted, or a crash left (".tmp-", on both backends).
func splitLayers(dirs ...string) (complete, temporary []string) {
	for _, dir := range dirs {
		for _, n := range dirEntries(dir) {
			if strings.HasPrefix(n, ".tmp-") {
				temporary = append(temporary, n)
			} else {
				complete = append(complete, n)
			}
		}
	}
	return complete, temporary
}

// crashDuring runs op and kills the daemon with SIGKILL as soon as
// underWay reports it under way (or after 20 s), then starts it again.
func crashDuring(t *testing.T, d *daemon, what string, op func() error, underWay func() bool) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- op() }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && !underWay() {
		time.Sleep(time.Millisecond)
	}
	d.Crash()
	t.Logf("%s cut by the crash: %v", what, <-done)
	d.Restart()
}

// checkLayersAfterCrash checks the layers a restart after crashDuring
// left: none partial, extra more complete ones than recorded snapshots,
// the snapshot kept still listed, and every snapshot booting (boots checks
// the sandbox made from it); each is then killed and its snapshot deleted.
func checkLayersAfterCrash(t *testing.T, d *daemon, dirs func() ([]string, []string), extra int, kept string, boots func(*client.Sandbox)) {
	t.Helper()
	ctx := ctxT(t)
	complete, tmp := dirs()
	if len(tmp) > 0 {
		t.Errorf("partial layers after restart: %v", tmp)
	}
	snaps, err := d.Client.ListSnapshots(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(complete) != len(snaps)+extra {
		t.Errorf("%d layers on disk for %d snapshots (and %d more kept) after restart: %v", len(complete), len(snaps), extra, complete)
	}
	if !slices.ContainsFunc(snaps, func(s api.SnapshotInfo) bool { return s.SnapshotID == kept }) {
		t.Errorf("the recorded snapshot is gone after restart: %+v", snaps)
	}
	for _, s := range snaps {
		b, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: s.SnapshotID})
		if err != nil {
			t.Errorf("create from snapshot %s after restart: %v", s.SnapshotID, err)
			continue
		}
		boots(b)
		d.Client.Kill(ctx, b.ID())
		if err := d.Client.DeleteSnapshot(ctx, s.SnapshotID); err != nil {
			t.Error(err)
		}
	}
}

// Through the Go SDK: checkpoints with a diff, rewind, forks that are
// independent of each other and of their parent, snapshots that outlive
// their sandbox and can be deleted while in use, and layers that go when
// their last user does.
func TestLayersGoSDK(t *testing.T) { forLayerStores(t, testLayersGoSDK) }

// forLayerStores runs f on a daemon with each native layer store: copies,
// and btrfs snapshots (a btrfs image under the data dir).
func forLayerStores(t *testing.T, f func(t *testing.T, flags ...string)) {
	t.Run("copy", func(t *testing.T) { f(t, "--layer-fs", "copy") })
	t.Run("btrfs", func(t *testing.T) {
		if _, err := exec.LookPath("mkfs.btrfs"); err != nil && !testutil.InCI() {
			t.Skip("no mkfs.btrfs (scripts/setup.sh installs btrfs-progs)")
		}
		f(t, "--layer-fs", "btrfs", "--layer-fs-size", "4G")
	})
}

func testLayersGoSDK(t *testing.T, flags ...string) {
	d := startDaemon(t, newDataDir(t), flags...)
	ctx := ctxT(t)
	if _, err := d.Client.CreateSecret(ctx, "layers-token", "s3cret-value", nil); err != nil {
		t.Fatal(err)
	}
	noInternet := false
	sb := d.create(t, api.NewSandbox{Metadata: map[string]string{"k": "v"}, EnvVars: map[string]string{"E": "env"},
		AllowInternetAccess: &noInternet,
		Network:             &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"api.example.com"}},
		Secrets:             map[string]api.SecretBinding{"TOKEN": {Secret: "layers-token", Hosts: []string{"api.example.com"}}}})
	e := sb.Envd()
	placeholder := rsh(t, e, `echo $TOKEN`)
	if strings.Contains(placeholder, "s3cret") || len(strings.TrimSpace(placeholder)) < 10 {
		t.Fatalf("TOKEN in the sandbox: %q", placeholder)
	}
	parentInfo, err := d.Client.Get(ctx, sb.ID())
	if err != nil || parentInfo.Network == nil || parentInfo.AllowInternetAccess == nil {
		t.Fatalf("parent: %+v, %v", parentInfo, err)
	}
	rsh(t, e, `mkdir -p /work && echo one > /work/a && echo keep > /work/k && rm /bin/ls`)
	cp1, err := d.Client.Checkpoint(ctx, sb.ID(), "one")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint: %d files, %d bytes, frozen %.1f ms", cp1.Files, cp1.Bytes, cp1.FrozenMs)
	rsh(t, e, `echo two > /work/a && rm /work/k && echo b > /work/b`)
	diff, err := d.Client.Diff(ctx, sb.ID(), "one", "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range diff {
		got[f.Path] = f.Change
	}
	want := map[string]string{"/work/a": "changed", "/work/k": "removed", "/work/b": "added"}
	for p, ch := range want {
		if got[p] != ch {
			t.Errorf("diff %s = %q, want %q (all: %+v)", p, got[p], ch, diff)
		}
	}
	if len(got) != len(want) {
		t.Errorf("diff has %d entries, want %d: %+v", len(got), len(want), diff)
	}
	since, err := d.Client.Diff(ctx, sb.ID(), "", "one")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(since, func(f api.FileDiff) bool { return f.Path == "/bin/ls" && f.Change == "removed" }) {
		t.Errorf("diff since create lacks the removal of /bin/ls: %+v", since)
	}

	// Rewind: files back, processes restarted, the same handle works.
	rsh(t, e, `sleep 3600 >/dev/null 2>&1 &`)
	if err := d.Client.Rewind(ctx, sb.ID(), cp1.CheckpointID); err != nil {
		t.Fatal(err)
	}
	if out := rsh(t, e, `cat /work/a /work/k; test -e /work/b && echo b; echo $E; ps | grep -c '[s]leep 3600' || true`); out != "one\nkeep\nenv\n0\n" {
		t.Errorf("after rewind: %q", out)
	}
	// The rewind kept the deadline, the placeholder, metadata and network.
	if info, err := d.Client.Get(ctx, sb.ID()); err != nil || !info.EndAt.Equal(parentInfo.EndAt) || info.Metadata["k"] != "v" ||
		!reflect.DeepEqual(info.Network, parentInfo.Network) {
		t.Errorf("after rewind: %+v, %v; before %+v", info, err, parentInfo)
	}
	if got := rsh(t, e, `echo $TOKEN`); got != placeholder {
		t.Errorf("TOKEN after rewind %q, was %q", got, placeholder)
	}

	// Forks: independent of each other and of the parent.
	rsh(t, e, `sleep 3600 >/dev/null 2>&1 &`)
	forks, errs, err := d.Client.Fork(ctx, sb.ID(), 2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range forks {
		if errs[i] != nil {
			t.Fatalf("fork %d: %v", i, errs[i])
		}
		t.Cleanup(func() { d.Client.Kill(context.Background(), f.ID()) })
	}
	f0, f1 := forks[0].Envd(), forks[1].Envd()
	rsh(t, f0, `echo f0 > /work/a; sleep 999 >/dev/null 2>&1 &`)
	if out := rsh(t, f1, `cat /work/a; ps | grep -c '[s]leep 999' || true; ps | grep -c '[s]leep 3600' || true`); out != "one\n0\n0\n" {
		t.Errorf("second fork sees %q", out)
	}
	if out := rsh(t, e, `cat /work/a; ps | grep -c '[s]leep 999' || true`); out != "one\n0\n" {
		t.Errorf("parent sees %q", out)
	}
	// A fork keeps the parent's metadata, network and secret bindings
	// (the placeholder its files may hold stays valid).
	if info, _ := d.Client.Get(ctx, forks[0].ID()); info == nil || info.Metadata["k"] != "v" ||
		!reflect.DeepEqual(info.Network, parentInfo.Network) || !reflect.DeepEqual(info.AllowInternetAccess, parentInfo.AllowInternetAccess) {
		t.Errorf("fork's info: %+v; parent's %+v", info, parentInfo)
	}
	if got := rsh(t, f1, `echo $TOKEN`); got != placeholder {
		t.Errorf("TOKEN in a fork %q, parent's %q", got, placeholder)
	}

	// A snapshot outlives its sandbox; deleting it while a sandbox made
	// from it runs is safe; its layer goes with the last user.
	sn, err := d.Client.CreateSnapshot(ctx, sb.ID(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		d.Client.Kill(ctx, f.ID())
	}
	if err := d.Client.Kill(ctx, sb.ID()); err != nil {
		t.Fatal(err)
	}
	// The sandbox booted on its checkpoint (the rewind), so the
	// snapshot's layer sits on the checkpoint's: both stay, the forks'
	// and the checkpoint's record go. In the copy store the snapshot
	// stacks on the sandbox's previous checkpoint (the fork's), which sits
	// on that one and stays too.
	wantLayers := 2
	if slices.Contains(flags, "copy") {
		wantLayers = 3
	}
	eventually(t, 10*time.Second, "only the snapshot's layers left", func() bool {
		complete, _ := layerDirs(d.DataDir)
		return len(complete) == wantLayers
	})
	// A create from the snapshot: its own environment on top of the
	// snapshot's, its own metadata.
	from, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: sn.SnapshotID, EnvVars: map[string]string{"N": "new"},
		Metadata: map[string]string{"from": "snap"}})
	if err != nil {
		t.Fatal(err)
	}
	if out := rsh(t, from.Envd(), `echo $E $N`); out != "env new\n" {
		t.Errorf("environment of a sandbox from the snapshot: %q, want the snapshot's E and the create's N", out)
	}
	if info, err := d.Client.Get(ctx, from.ID()); err != nil || info.Metadata["from"] != "snap" || info.Metadata["k"] != "" {
		t.Errorf("sandbox from the snapshot: %+v, %v; want the create's metadata alone", info, err)
	}
	if err := d.Client.DeleteSnapshot(ctx, sn.SnapshotID); err != nil {
		t.Fatal(err)
	}
	if out := rsh(t, from.Envd(), `cat /work/a`); out != "one\n" {
		t.Errorf("sandbox from a deleted snapshot reads %q", out)
	}
	if complete, _ := layerDirs(d.DataDir); len(complete) != wantLayers {
		t.Errorf("the layer of a deleted snapshot in use is gone: %v", complete)
	}
	if err := d.Client.Kill(ctx, from.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "no layer left once its last user is gone", func() bool {
		complete, tmp := layerDirs(d.DataDir)
		return len(complete)+len(tmp) == 0
	})
	if err := d.Client.DeleteSnapshot(ctx, sn.SnapshotID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("second delete: %v, want not found", err)
	}
}

// kill -9 of the daemon while it snapshots, forks, checkpoints, rewinds
// or pauses without memory: the next start keeps what was recorded (a
// snapshot, usable; a recorded pause, which resumes) and removes the rest (half-copied layers, the layers of checkpoints and
// forks of sandboxes that died with the daemon).
func TestLayersCrashConsistency(t *testing.T) { forLayerStores(t, testLayersCrashConsistency) }

func testLayersCrashConsistency(t *testing.T, flags ...string) {
	d := startDaemon(t, newDataDir(t), flags...)
	ctx := ctxT(t)
	for _, op := range []string{"snapshot", "fork", "checkpoint", "rewind", "pause"} {
		t.Run(op, func(t *testing.T) {
			// Not d.create: its cleanup would use the crashed daemon's URL.
			sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "minimal"})
			if err != nil {
				t.Fatal(err)
			}
			e := sb.Envd()
			// Enough files that the copy takes a while.
			rsh(t, e, `mkdir -p /w && cd /w && i=0; while [ $i -lt 3000 ]; do echo $i > f$i; i=$((i+1)); done; head -c 64000000 /dev/zero > big`)
			kept, err := d.Client.CreateSnapshot(ctx, sb.ID(), "")
			if err != nil {
				t.Fatal(err)
			}
			cp, err := d.Client.Checkpoint(ctx, sb.ID(), "")
			if err != nil {
				t.Fatal(err)
			}
			// Crash as soon as the operation is under way.
			crashDuring(t, d, op, func() error {
				var err error
				switch op {
				case "snapshot":
					_, err = d.Client.CreateSnapshot(ctx, sb.ID(), "")
				case "fork":
					_, _, err = d.Client.Fork(ctx, sb.ID(), 3, time.Minute)
				case "checkpoint":
					_, err = d.Client.Checkpoint(ctx, sb.ID(), "")
				case "rewind":
					err = d.Client.Rewind(ctx, sb.ID(), cp.CheckpointID)
				case "pause":
					err = d.Client.PauseWithoutMemory(ctx, sb.ID())
				}
				return err
			}, func() bool {
				complete, tmp := layerDirs(d.DataDir)
				if op == "rewind" && len(complete)+len(tmp) > 0 {
					time.Sleep(30 * time.Millisecond) // into the reboot
					return true
				}
				return len(tmp) > 0
			})
			extra := 0
			if op == "pause" {
				// A pause recorded before the crash outlives it: the sandbox
				// is paused on its layer (resumed here, it runs on it), its
				// checkpoint kept; else it is gone.
				info, err := d.Client.Get(ctx, sb.ID())
				switch {
				case err == nil && info.State == "paused":
					extra = 2
					resumed, err := d.Client.Connect(ctx, sb.ID(), time.Minute)
					if err != nil {
						t.Fatalf("Connect of the pause recorded before the crash: %v", err)
					}
					if out := rsh(t, resumed.Envd(), `cat /w/f2999`); out != "2999\n" {
						t.Errorf("the paused sandbox reads %q after the crash", out)
					}
					t.Logf("the pause was recorded before the crash")
				case err != nil && !errors.Is(err, api.ErrNotFound):
					t.Fatal(err)
				}
			}
			// The btrfs store: a snapshot for each layer, none without one.
			if snapDir := filepath.Join(d.DataDir, "native", "layerfs", "layers", instanceOf(d.DataDir)); len(flags) > 1 && flags[1] == "btrfs" {
				complete, _ := layerDirs(d.DataDir)
				if got := dirEntries(snapDir); len(got) != len(complete) {
					t.Errorf("%d btrfs snapshots for %d layers after restart: %v", len(got), len(complete), got)
				}
			}
			checkLayersAfterCrash(t, d, func() ([]string, []string) { return layerDirs(d.DataDir) }, extra, kept.SnapshotID, func(b *client.Sandbox) {
				if out := rsh(t, b.Envd(), `cat /w/f2999`); out != "2999\n" {
					t.Errorf("a sandbox from a snapshot reads %q", out)
				}
			})
			if op == "pause" {
				d.Client.Kill(ctx, sb.ID()) // if it was paused: its layers go
			}
			if _, err := d.Client.Get(ctx, sb.ID()); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("sandbox after restart: %v, want not found", err)
			}
			eventually(t, 10*time.Second, "no layer left", func() bool {
				complete, tmp := layerDirs(d.DataDir)
				return len(complete)+len(tmp) == 0
			})
			assertNoSandboxLeftovers(t, d.DataDir, d.sandboxIDs(), nil)
		})
	}
}

// rsh runs a shell script as root in the sandbox and fails t unless it
// exits 0.
func rsh(t testing.TB, e *client.Envd, script string) string {
	t.Helper()
	out, errs, st := run(t, e, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", script}, User: "root"})
	if st.ExitCode != 0 {
		t.Fatalf("sh -c %q: exit %d (%s), stderr %q", script, st.ExitCode, st.Status, errs)
	}
	return out
}

// fence sandbox checkpoint|checkpoints|diff|rewind against a daemon.
func TestLayersCLI(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{})
	e := sb.Envd()
	rsh(t, e, `echo one > /a`)
	out, errOut, code := d.fenceCLI(t, nil, "sandbox", "checkpoint", sb.ID(), "--name", "first")
	if code != 0 || len(strings.TrimSpace(out)) == 0 {
		t.Fatalf("checkpoint: %q %q exit %d", out, errOut, code)
	}
	cp := strings.TrimSpace(out)
	rsh(t, e, `echo two > /a; echo new > /b`)
	out, errOut, code = d.fenceCLI(t, nil, "sandbox", "diff", sb.ID(), "--from", "first")
	if code != 0 || !strings.Contains(out, "M  4") || !strings.Contains(out, "/a\n") || !strings.Contains(out, "/b\n") {
		t.Errorf("diff: %q %q exit %d", out, errOut, code)
	}
	out, _, _ = d.fenceCLI(t, nil, "sandbox", "checkpoints", sb.ID())
	if !strings.Contains(out, cp) || !strings.Contains(out, "first") {
		t.Errorf("checkpoints: %q", out)
	}
	if _, errOut, code := d.fenceCLI(t, nil, "sandbox", "rewind", sb.ID(), cp); code != 0 {
		t.Fatalf("rewind: %q exit %d", errOut, code)
	}
	if got := rsh(t, e, `cat /a; test -e /b && echo b; true`); got != "one\n" {
		t.Errorf("after rewind: %q", got)
	}
	if _, errOut, code := d.fenceCLI(t, nil, "sandbox", "rewind", sb.ID(), "nope"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("rewind to an unknown checkpoint: %q exit %d", errOut, code)
	}
}

// Commands right after a rewind reach the sandbox's new processes: the
// daemon's proxy keeps connections to a sandbox's agent open between
// requests, and those to the agent a rewind killed must never be reused
// (a command then failed with 502, the old agent's connection reset).
func TestRewindThenCommandsAtOnce(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{})
	e := sb.Envd()
	rsh(t, e, `echo one > /a`)
	cp, err := d.Client.Checkpoint(t.Context(), sb.ID(), "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		rsh(t, e, fmt.Sprintf(`echo %d > /a`, i))
		if err := d.Client.Rewind(t.Context(), sb.ID(), cp.CheckpointID); err != nil {
			t.Fatalf("rewind %d: %v", i, err)
		}
		if got := rsh(t, e, `cat /a`); got != "one\n" {
			t.Fatalf("after rewind %d: /a = %q, want one", i, got)
		}
	}
}

// A sandbox that dies after a rewind (or a filesystem-only resume) is
// noticed like any other: the manager follows the backend sandbox that
// replaced the first.
func TestLayersDeathAfterReboot(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	for _, how := range []string{"rewind", "cold resume"} {
		sb := d.create(t, api.NewSandbox{})
		switch how {
		case "rewind":
			cp, err := d.Client.Checkpoint(ctx, sb.ID(), "")
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Client.Rewind(ctx, sb.ID(), cp.CheckpointID); err != nil {
				t.Fatal(err)
			}
		case "cold resume":
			if err := d.Client.PauseWithoutMemory(ctx, sb.ID()); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Client.Connect(ctx, sb.ID(), time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		if err := syscall.Kill(agentPID(t, sb.ID()), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, how+": the dead sandbox is gone", func() bool {
			_, err := d.Client.Get(ctx, sb.ID())
			return errors.Is(err, api.ErrNotFound)
		})
	}
}
