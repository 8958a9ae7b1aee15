package native_test

import (
	"context"
	"io"
	"log"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/fencesandbox/fence/internal/contentreg"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/testutil"
)

// otherBackend is a second backend of the test, as another node's: its
// own state directory and instance.
func otherBackend(t *testing.T) *native.Backend {
	t.Helper()
	b, err := native.New(t.Context(), native.Options{StateDir: filepath.Join(testutil.StateDir(t), "other"),
		Instance: "othernode", Executable: testutil.FenceBinary(t), CopyLayers: true, Network: isolationtest.Network(nil),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatalf("native.New: %v", err)
	}
	t.Cleanup(func() {
		b.Cleanup(context.Background())
		b.Close()
	})
	return b
}

// Layers move between nodes through a registry as they are on disk: a
// stack of two layers pushed from one backend and imported into another
// boots sandboxes there that see the files, owners, modes and deletions
// of both; an import of a tree that is not the layer it claims to be
// leaves nothing.
func TestLayerMovesBetweenNodes(t *testing.T) {
	a := newBackendWith(t, native.Options{CopyLayers: true})
	b := otherBackend(t)
	checkpoint := func(sb isolation.Sandbox) isolation.LayerInfo {
		t.Helper()
		info, err := sb.(isolation.Checkpointer).Checkpoint(t.Context())
		if err != nil {
			t.Fatalf("Checkpoint: %v", err)
		}
		return info
	}
	src := create(t, a, isolation.Spec{})
	sh(t, src, `set -e; mkdir -p /home/app; echo one > /home/app/a; chown 1000:1000 /home/app/a; chmod 640 /home/app/a
		ln /home/app/a /home/app/hard; rm /bin/ls`)
	low := checkpoint(src)
	mid := createOn(t, a, low.ID)
	sh(t, mid, `echo two > /home/app/b`)
	top := checkpoint(mid)

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	reg, err := contentreg.New(contentreg.Options{URL: strings.TrimPrefix(srv.URL, "http://") + "/fence"})
	if err != nil {
		t.Fatal(err)
	}
	digests := map[string]string{}
	for _, id := range []string{top.ID, low.ID} {
		dir, parent, err := a.LayerSource(id)
		if err != nil {
			t.Fatalf("LayerSource(%s): %v", id, err)
		}
		if want := map[string]string{top.ID: low.ID, low.ID: ""}[id]; parent != want {
			t.Fatalf("LayerSource(%s) parent = %q, want %q", id, parent, want)
		}
		if digests[id], err = reg.PushTree(t.Context(), "layers", id, dir, nil); err != nil {
			t.Fatalf("PushTree(%s): %v", id, err)
		}
	}
	pull := func(id string) func(string) error {
		return func(dir string) error { _, err := reg.PullTree(t.Context(), "layers", digests[id], dir); return err }
	}
	rootfs := testutil.RootFS(t, "minimal")
	if err := b.ImportLayer(t.Context(), top.ID, low.ID, rootfs, pull(top.ID)); err == nil {
		t.Fatal("ImportLayer of a layer whose parent is not here succeeded")
	}
	// A tree that claims another layer's place is refused, and leaves nothing.
	if err := b.ImportLayer(t.Context(), low.ID, "", rootfs, pull(top.ID)); err == nil || b.LayerHere(low.ID) {
		t.Fatalf("ImportLayer of the wrong tree = %v, here %v", err, b.LayerHere(low.ID))
	}
	left, _ := filepath.Glob(filepath.Join(testutil.StateDir(t), "other", "layers", "*", ".tmp-*"))
	if len(left) > 0 {
		t.Fatalf("a refused import left %v", left)
	}
	for _, l := range []struct{ id, parent string }{{low.ID, ""}, {top.ID, low.ID}} {
		if err := b.ImportLayer(t.Context(), l.id, l.parent, rootfs, pull(l.id)); err != nil {
			t.Fatalf("ImportLayer(%s): %v", l.id, err)
		}
	}
	if err := b.ImportLayer(t.Context(), top.ID, low.ID, rootfs, func(string) error { t.Fatal("fill called for a layer already here"); return nil }); err != nil {
		t.Fatal(err)
	}
	const look = `cat /home/app/a /home/app/b; stat -c '%u:%g %a %h' /home/app/a /home/app/hard; test -e /bin/ls && echo ls-back || echo ls-gone`
	here := sh(t, createOn(t, a, top.ID), look)
	got := sh(t, createOn(t, b, top.ID), look)
	if !strings.HasPrefix(got, "one\ntwo\n1000:1000 640 ") || !strings.HasSuffix(got, "ls-gone\n") || got != here {
		t.Fatalf("sandbox on the moved layers sees %q, on the source node %q", got, here)
	}
}
