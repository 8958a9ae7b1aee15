package isolationtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
)

// RunLayers runs the cases every backend that implements isolation.Layers
// (and whose sandboxes implement isolation.Checkpointer) must pass:
// a checkpoint of a running sandbox holds its files as they were, the
// sandbox runs on unchanged, sandboxes booted on the layer see its files
// and are independent of each other and of the source, a layer stacks on
// the layer its sandbox booted on, and a deleted layer leaves the
// sandboxes running on it unharmed. A backend that cannot list a layer's
// changed files (LayerChanges wraps isolation.ErrUnsupported, as gVisor's
// whose writable layer is its own overlay file) passes the rest; a
// backend whose checkpoints are memory layers (whole images) passes the
// cases of those instead of stacking and refused deletes.
func RunLayers(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	h, src, cp := newLayerHarness(t, newBackend, rootfs)
	l, sh := h.l, h.sh
	on := func(layer string) isolation.Sandbox {
		t.Helper()
		return h.on(isolation.Spec{ID: NewID(), RootFS: rootfs}, layer)
	}
	sh(src, `mkdir -p /data && echo one > /data/a && rm -f /bin/true`)
	first, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatalf("Checkpoint() = %v", err)
	}
	if first.Parent != cp.Base() || first.Depth != 1 {
		t.Errorf("checkpoint of a template sandbox: parent %q depth %d", first.Parent, first.Depth)
	}
	sh(src, `echo later > /data/a`)
	a, c := on(first.ID), on(first.ID)
	if got := sh(a, `cat /data/a; test -e /bin/true && echo true-present; true`); got != "one\n" {
		t.Errorf("sandbox on the checkpoint reads %q, want one", got)
	}
	sh(a, `echo mine > /data/a`)
	if got := sh(c, `cat /data/a`); got != "one\n" {
		t.Errorf("a write in one sandbox on the layer reached another: %q", got)
	}
	if got := sh(src, `cat /data/a`); got != "later\n" {
		t.Errorf("the source reads %q", got)
	}
	h.checkChanges(first.ID)
	acp, _ := isolation.As[isolation.Checkpointer](a)
	second, err := acp.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// A memory layer (LayerInfo.Memory) is a whole image: it has no
	// parent, and sandboxes restored from it no longer read it, so it can
	// be deleted under them. A files layer stacks on its sandbox's layer.
	whole := second.Memory
	if whole && (second.Parent != "" || second.Depth != 1) {
		t.Errorf("memory checkpoint of a sandbox on a layer: parent %q depth %d, want none", second.Parent, second.Depth)
	}
	if !whole && (second.Parent != first.ID || second.Depth != 2) {
		t.Errorf("checkpoint of a sandbox on a layer: parent %q depth %d, want %q 2", second.Parent, second.Depth, first.ID)
	}
	d := on(second.ID)
	if got := sh(d, `cat /data/a`); got != "mine\n" {
		t.Errorf("sandbox on a stacked layer reads %q", got)
	}
	if whole {
		if err := l.DeleteLayer(t.Context(), second.ID); err != nil {
			t.Fatalf("DeleteLayer of a memory layer under a sandbox = %v", err)
		}
		if got := sh(d, `cat /data/a`); got != "mine\n" {
			t.Errorf("after its memory layer was deleted, a sandbox restored from it reads %q", got)
		}
		h.checkDeleted(second.ID)
		return
	}
	h.checkDeleteInUse(d, second.ID)
}

// checkChanges checks the changed files LayerChanges lists for the first
// checkpoint of RunLayers (/data/a written, /bin/true removed), when the
// backend can list them.
func (h *layerHarness) checkChanges(id string) {
	t := h.t
	t.Helper()
	switch changes, err := h.l.LayerChanges(t.Context(), id); {
	case errors.Is(err, isolation.ErrUnsupported):
		t.Logf("LayerChanges: %v (not supported by %s)", err, h.name)
	case err != nil:
		t.Fatal(err)
	default:
		found := map[string]string{}
		for _, ch := range changes {
			found[ch.Path] = ch.Kind
		}
		if found["/data/a"] != "file" || found["/bin/true"] != "removed" {
			t.Errorf("LayerChanges: %+v", changes)
		}
	}
}

// checkDeleteInUse checks that layer id, under the live sandbox d (which
// reads "mine" in /data/a), cannot be deleted, and that once d is killed
// it can.
func (h *layerHarness) checkDeleteInUse(d isolation.Sandbox, id string) {
	t := h.t
	t.Helper()
	if err := h.l.DeleteLayer(t.Context(), id); !errors.Is(err, isolation.ErrLayerInUse) {
		t.Errorf("DeleteLayer of a layer in use = %v, want ErrLayerInUse", err)
	}
	if got := h.sh(d, `cat /data/a`); got != "mine\n" {
		t.Errorf("after a refused delete, a sandbox on the layer reads %q", got)
	}
	d.Kill(t.Context())
	deleted := false
	for range 500 {
		if err := h.l.DeleteLayer(t.Context(), id); err == nil {
			deleted = true
			break
		} else if !errors.Is(err, isolation.ErrLayerInUse) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !deleted {
		t.Fatalf("the layer of a killed sandbox stays in use")
	}
	h.checkDeleted(id)
}

// layerHarness is what RunLayers and RunMemoryLayers share: a backend's
// Layers and the sandboxes a case makes on them.
type layerHarness struct {
	t      *testing.T
	l      isolation.Layers
	rootfs string
	name   string // the backend's
}

// newLayerHarness makes the backend and a running source sandbox, which
// must implement isolation.Checkpointer.
func newLayerHarness(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) (*layerHarness, isolation.Sandbox, isolation.Checkpointer) {
	t.Helper()
	b := newBackend(t)
	l, ok := b.(isolation.Layers)
	if !ok {
		t.Fatalf("backend %s does not implement isolation.Layers", b.Name())
	}
	src := create(t, b, rootfs)
	cp, ok := isolation.As[isolation.Checkpointer](src)
	if !ok {
		t.Fatalf("sandbox of %s does not implement isolation.Checkpointer", b.Name())
	}
	return &layerHarness{t: t, l: l, rootfs: rootfs, name: b.Name()}, src, cp
}

// sh runs script in s and returns its output; a failure fails the test.
func (h *layerHarness) sh(s isolation.Sandbox, script string) string {
	h.t.Helper()
	return mustExec(h.t, s, "/bin/sh", "-c", script)
}

// on boots spec on layer, killed at the test's end.
func (h *layerHarness) on(spec isolation.Spec, layer string) isolation.Sandbox {
	h.t.Helper()
	s, err := h.l.CreateOn(h.t.Context(), spec, layer)
	if err != nil {
		h.t.Fatalf("CreateOn(%s) = %v", layer, err)
	}
	h.t.Cleanup(func() { s.Kill(context.WithoutCancel(h.t.Context())) })
	return s
}

// checkDeleted checks that layer id, deleted, is listed no more and boots
// nothing (ErrNotFound).
func (h *layerHarness) checkDeleted(id string) {
	t := h.t
	t.Helper()
	list, err := h.l.ListLayers(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, li := range list {
		if li.ID == id {
			t.Errorf("ListLayers lists deleted layer %s", id)
		}
	}
	if s, err := h.l.CreateOn(t.Context(), isolation.Spec{ID: NewID(), RootFS: h.rootfs}, id); err == nil {
		s.Kill(context.WithoutCancel(t.Context()))
		t.Errorf("CreateOn(deleted layer) succeeded")
	} else if !errors.Is(err, isolation.ErrNotFound) {
		t.Errorf("CreateOn(deleted layer) = %v, want ErrNotFound", err)
	}
}
