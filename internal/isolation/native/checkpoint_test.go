package native_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/testutil"
)

func createOn(t *testing.T, b *native.Backend, layer string) isolation.Sandbox {
	t.Helper()
	sb, err := b.CreateOn(t.Context(), isolation.Spec{RootFS: testutil.RootFS(t, "minimal")}, layer)
	if err != nil {
		t.Fatalf("CreateOn(%s): %v", layer, err)
	}
	t.Cleanup(func() { sb.Kill(context.Background()) })
	return sb
}

func sh(t *testing.T, sb isolation.Sandbox, script string) string {
	t.Helper()
	r := run(t, sb, "root", "/bin/sh", "-c", script)
	if r.exit != 0 {
		t.Fatalf("%q: exit %d, stderr %q", script, r.exit, r.stderr)
	}
	return r.stdout
}

// A checkpoint is a copy of what the sandbox changed, frozen: sandboxes
// booted on it see those changes (deletions and opaque directories
// included), their own writes stay their own, and the running source's
// later writes never reach it.
func TestCheckpointLayers(t *testing.T) { forStores(t, testCheckpointLayers) }

func testCheckpointLayers(t *testing.T, opts native.Options) {
	b := newBackendWith(t, opts)
	src := create(t, b, isolation.Spec{})
	sh(t, src, `set -e
		mkdir -p /home/app/sub && echo one > /home/app/a && echo two > /home/app/sub/b
		ln -s a /home/app/link
		rm /bin/ls
		rm -rf /etc/init.d 2>/dev/null; mkdir -p /usr/share && rm -rf /usr/share && mkdir /usr/share && echo new > /usr/share/only
		chown 1000:1000 /home/app/a && chmod 640 /home/app/a
		sleep 3600 >/dev/null 2>&1 &`)
	cp, ok := src.(isolation.Checkpointer)
	if !ok {
		t.Fatal("native sandbox is not a Checkpointer")
	}
	info, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	t.Logf("checkpoint %s: %d entries, %d bytes, frozen %v", info.ID, info.Files, info.Bytes, info.Took)
	// The source runs on, its process too, and its later writes are its own.
	sh(t, src, `pgrep sleep >/dev/null || ps | grep -q 'sleep 3600'; echo three > /home/app/a; echo later > /home/app/later`)

	f1 := createOn(t, b, info.ID)
	f2 := createOn(t, b, info.ID)
	got := sh(t, f1, `cat /home/app/a /home/app/sub/b; readlink /home/app/link; stat -c '%u %g %a' /home/app/a; test -e /bin/ls && echo ls-present; ls /usr/share; test -e /home/app/later && echo later-present; true`)
	want := "one\ntwo\na\n1000 1000 640\nonly\n"
	if got != want {
		t.Errorf("fork sees %q, want %q", got, want)
	}
	if out := sh(t, f1, `ps | grep -c '[s]leep 3600' || true`); strings.TrimSpace(out) != "0" {
		t.Errorf("a fork runs the source's processes: %q", out)
	}
	sh(t, f1, `echo mine > /home/app/a; touch /home/app/f1only`)
	if got := sh(t, f2, `cat /home/app/a; test -e /home/app/f1only && echo leaked; true`); got != "one\n" {
		t.Errorf("second fork sees %q after a write in the first", got)
	}
	if got := sh(t, src, `cat /home/app/a; test -e /home/app/f1only && echo leaked; true`); got != "three\n" {
		t.Errorf("source sees %q after a write in a fork", got)
	}

	// Changes of the layer: hashes and kinds.
	ch, err := b.LayerChanges(t.Context(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]isolation.FileChange{}
	for _, c := range ch {
		byPath[c.Path] = c
	}
	if c := byPath["/home/app/a"]; c.Kind != "file" || c.Size != 4 || c.SHA256 != "2c8b08da5ce60398e1f19af0e5dccc744df274b826abe585eaba68c525434806" {
		t.Errorf("/home/app/a in the layer: %+v", c)
	}
	if c := byPath["/bin/ls"]; c.Kind != "removed" {
		t.Errorf("/bin/ls in the layer: %+v", c)
	}
	if c := byPath["/home/app/link"]; c.Kind != "symlink" || c.Target != "a" {
		t.Errorf("/home/app/link in the layer: %+v", c)
	}

	// A checkpoint of a fork stacks on the layer it booted on.
	info2, err := f1.(isolation.Checkpointer).Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info2.Parent != info.ID || info2.Depth != 2 {
		t.Errorf("checkpoint of a fork: parent %q depth %d, want %q 2", info2.Parent, info2.Depth, info.ID)
	}
	g := createOn(t, b, info2.ID)
	if got := sh(t, g, `cat /home/app/a /home/app/sub/b; test -e /home/app/f1only && echo f1only`); got != "mine\ntwo\nf1only\n" {
		t.Errorf("sandbox on a stacked layer sees %q", got)
	}
	// A layer under a running sandbox is not deleted; once it is gone,
	// the layer can be.
	if err := b.DeleteLayer(t.Context(), info2.ID); !errors.Is(err, isolation.ErrLayerInUse) {
		t.Errorf("DeleteLayer under a running sandbox = %v, want ErrLayerInUse", err)
	}
	g.Kill(t.Context())
	for i := 0; ; i++ {
		err := b.DeleteLayer(t.Context(), info2.ID)
		if err == nil {
			break
		}
		if !errors.Is(err, isolation.ErrLayerInUse) || i > 500 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := b.CreateOn(t.Context(), isolation.Spec{RootFS: testutil.RootFS(t, "minimal")}, info2.ID); !errors.Is(err, isolation.ErrNotFound) {
		t.Errorf("CreateOn a deleted layer: %v, want ErrNotFound", err)
	}
}

// A layer being made when the daemon dies is removed by Cleanup; the
// budget refuses a layer that would not fit.
func TestCheckpointCrashAndBudget(t *testing.T) { forStores(t, testCheckpointCrashAndBudget) }

func testCheckpointCrashAndBudget(t *testing.T, opts native.Options) {
	opts.LayerBudget = 1 << 20
	b := newBackendWith(t, opts)
	src := create(t, b, isolation.Spec{})
	sh(t, src, `head -c 2000000 /dev/zero > /big`)
	_, err := src.(isolation.Checkpointer).Checkpoint(t.Context())
	if !errors.Is(err, isolation.ErrLayerBudget) {
		t.Fatalf("Checkpoint over budget: %v, want ErrLayerBudget", err)
	}
	layers, _ := b.ListLayers(t.Context())
	if len(layers) != 0 {
		t.Errorf("a refused checkpoint left layers: %+v", layers)
	}
	// A crash half-way through a copy leaves a temporary layer; one
	// between a snapshot and its layer's rename leaves a snapshot no
	// layer owns.
	half := filepath.Join(b.LayersDir(), ".tmp-crashed")
	if err := os.MkdirAll(filepath.Join(half, "tree", "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	var orphan string
	if sd := b.SnapshotDir(); sd != "" {
		sh(t, src, `rm /big; echo small > /small`)
		info, err := src.(isolation.Checkpointer).Checkpoint(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(b.LayersDir(), info.ID), half+"2"); err != nil {
			t.Fatal(err)
		}
		orphan = filepath.Join(sd, info.ID)
		if _, err := os.Stat(orphan); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	var left []string
	filepath.WalkDir(b.LayersDir(), func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".tmp-") {
			left = append(left, p)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("temporary layers left: %v", left)
	}
	if orphan != "" {
		if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a snapshot no layer owns is left after Cleanup: %v", err)
		}
	}
}

// A second checkpoint stacks on the first: its layer holds only what
// changed since (a file rewritten at once after the first with the same
// size among them), and a sandbox booted on it sees both.
func TestCheckpointIncremental(t *testing.T) {
	b := newBackendWith(t, native.Options{CopyLayers: true})
	src := create(t, b, isolation.Spec{})
	sh(t, src, `echo same > /same && echo one > /changed && sleep 0.2`)
	cp := src.(isolation.Checkpointer)
	first, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	sh(t, src, `echo two > /changed`) // same size, right after
	second, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if second.Parent != first.ID || second.Depth != first.Depth+1 {
		t.Errorf("second checkpoint: parent %q depth %d, want %q %d", second.Parent, second.Depth, first.ID, first.Depth+1)
	}
	exists := func(layer, name string) bool {
		_, err := os.Lstat(filepath.Join(b.LayersDir(), layer, "tree", name))
		return err == nil
	}
	if exists(second.ID, "same") {
		t.Errorf("an unchanged file is in the second checkpoint's layer")
	}
	if !exists(second.ID, "changed") {
		t.Errorf("a changed file is not in the second checkpoint's layer")
	}
	if second.Bytes >= first.Bytes {
		t.Errorf("second checkpoint %d bytes, first %d", second.Bytes, first.Bytes)
	}
	g := createOn(t, b, second.ID)
	if got := sh(t, g, `cat /same /changed`); got != "same\ntwo\n" {
		t.Errorf("sandbox on the second checkpoint reads %q", got)
	}
}
