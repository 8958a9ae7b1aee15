package sandbox

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
)

// layerBackend is the fake backend with in-memory layers: a checkpoint
// is a layer with no files, and listing a sandbox's or a layer's changes
// calls onRead first (a test holds a diff in the middle of its reading
// there).
type layerBackend struct {
	*fake.Backend
	onRead func(ctx context.Context, what string)

	mu sync.Mutex
	// +checklocks:mu
	layers map[string]isolation.LayerInfo
	// deleted receives each deleted layer's ID (buffered).
	deleted chan string
}

var (
	_ isolation.Layers       = (*layerBackend)(nil)
	_ isolation.Checkpointer = (*layerBox)(nil)
)

func newLayerBackend(b *fake.Backend) *layerBackend {
	return &layerBackend{Backend: b, layers: map[string]isolation.LayerInfo{}, deleted: make(chan string, 100),
		onRead: func(context.Context, string) {}}
}

func (b *layerBackend) Create(ctx context.Context, spec isolation.Spec) (isolation.Sandbox, error) {
	return b.CreateOn(ctx, spec, "")
}

func (b *layerBackend) CreateOn(ctx context.Context, spec isolation.Spec, layer string) (isolation.Sandbox, error) {
	if layer != "" && !b.has(layer) {
		return nil, fmt.Errorf("layer %s: %w", layer, isolation.ErrNotFound)
	}
	s, err := b.Backend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &layerBox{Sandbox: s, b: b, base: layer}, nil
}

func (b *layerBackend) has(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.layers[id]
	return ok
}

func (b *layerBackend) LayerChanges(ctx context.Context, layer string) ([]isolation.FileChange, error) {
	if !b.has(layer) {
		return nil, fmt.Errorf("layer %s: %w", layer, isolation.ErrNotFound)
	}
	b.onRead(ctx, layer)
	if !b.has(layer) {
		return nil, fmt.Errorf("layer %s deleted while read: %w", layer, isolation.ErrNotFound)
	}
	return []isolation.FileChange{{Path: "/f", Kind: "file", SHA256: layer}}, nil
}

func (b *layerBackend) ListLayers(ctx context.Context) ([]isolation.LayerInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]isolation.LayerInfo, 0, len(b.layers))
	for _, l := range b.layers {
		out = append(out, l)
	}
	return out, nil
}

func (b *layerBackend) DeleteLayer(ctx context.Context, id string) error {
	b.mu.Lock()
	_, ok := b.layers[id]
	delete(b.layers, id)
	b.mu.Unlock()
	if ok {
		b.deleted <- id
	}
	return nil
}

type layerBox struct {
	isolation.Sandbox
	b    *layerBackend
	base string
}

func (s *layerBox) Checkpoint(ctx context.Context) (isolation.LayerInfo, error) {
	l := isolation.LayerInfo{ID: isolation.NewID(), Parent: s.base, Depth: 1, Created: time.Now()}
	s.b.mu.Lock()
	s.b.layers[l.ID] = l
	s.b.mu.Unlock()
	return l, nil
}

func (s *layerBox) Changes(ctx context.Context) ([]isolation.FileChange, error) {
	s.b.onRead(ctx, s.ID())
	return []isolation.FileChange{{Path: "/f", Kind: "file", SHA256: "now"}}, nil
}

func (s *layerBox) Base() string { return s.base }

// TestDiffReadsWithoutLayerLock: a diff reads the files of its layers
// without the layer lock, so that, while one diff is in the middle of
// its reading (held in the backend's LayerChanges), the layer collector
// runs and a checkpoint of another sandbox completes (a collector
// waiting for the lock would hold every other layer operation back); the
// layer the diff reads, its record deleted meanwhile, is kept until the
// diff is done, and collected then.
func TestDiffReadsWithoutLayerLock(t *testing.T) {
	var lb *layerBackend
	e := newEnv(t, func(o *Options) {
		lb = newLayerBackend(o.Backend.(*fake.Backend))
		o.Backend = lb
	})
	ctx := t.Context()
	a, b := e.mustCreate(t, CreateRequest{}), e.mustCreate(t, CreateRequest{})
	cp, err := e.m.CreateCheckpoint(ctx, a.ID, "one", false)
	if err != nil {
		t.Fatalf("CreateCheckpoint(%s) = %v", a.ID, err)
	}
	cps, err := e.store.Checkpoints(ctx, a.ID)
	if err != nil || len(cps) != 1 {
		t.Fatalf("Checkpoints(%s) = %v, %v", a.ID, cps, err)
	}
	layer := cps[0].Layer

	reading, release := make(chan struct{}), make(chan struct{})
	lb.onRead = func(_ context.Context, what string) {
		if what == layer {
			close(reading)
			<-release
		}
	}
	type result struct {
		d   []FileDiff
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := e.m.Diff(ctx, a.ID, cp.ID, "now")
		done <- result{d, err}
	}()
	<-reading
	if !e.m.layerMu.mu.TryLock() {
		close(release)
		<-done
		t.Fatalf("a diff holds the layer lock while it reads its layers")
	}
	e.m.layerMu.mu.Unlock() // +checklocksignore: taken by TryLock above
	// The checkpoint's record goes; the collector keeps its layer while
	// the diff reads it.
	if err := e.store.DeleteCheckpoints(ctx, a.ID, cp.ID); err != nil {
		t.Fatal(err)
	}
	if err := collect(ctx, e.m); err != nil {
		t.Errorf("gc while a diff reads = %v", err)
	}
	if !lb.has(layer) {
		t.Errorf("gc deleted layer %s while a diff read it", layer)
	}
	if _, err := e.m.CreateCheckpoint(ctx, b.ID, "", false); err != nil {
		t.Errorf("CreateCheckpoint(%s) while another sandbox's diff reads = %v", b.ID, err)
	}
	close(release)
	r := <-done
	if r.err != nil || len(r.d) != 1 || r.d[0].Change != "changed" || r.d[0].OldSHA256 != layer {
		t.Errorf("Diff(%s, %s, now) = %+v, %v; want /f changed from the checkpoint's", a.ID, cp.ID, r.d, r.err)
	}
	// Unpinned, the layer goes with the next collection, which the
	// unpin asks for.
	for id := range lb.deleted {
		if id == layer {
			break
		}
	}
}

// collect runs gc, again while the collector's own run holds the lock.
func collect(ctx context.Context, m *Manager) error {
	for {
		err := m.gc(ctx)
		if !errors.Is(err, errLayersBusy) {
			return err
		}
		runtime.Gosched()
	}
}

// TestLayerCollectorNeverWaits: the layer collector does not wait for a
// layer lock held for reading (by a long checkpoint, say), which would
// hold every later reader back; it runs once the last reader is done.
func TestLayerCollectorNeverWaits(t *testing.T) {
	var lb *layerBackend
	e := newEnv(t, func(o *Options) {
		lb = newLayerBackend(o.Backend.(*fake.Backend))
		o.Backend = lb
	})
	ctx := t.Context()
	orphan := isolation.NewID()
	lb.mu.Lock()
	lb.layers[orphan] = isolation.LayerInfo{ID: orphan, Depth: 1}
	lb.mu.Unlock()

	e.m.layerMu.RLock() // a checkpoint being made
	if err := e.m.gc(ctx); !errors.Is(err, errLayersBusy) {
		t.Errorf("gc under a reader = %v, want errLayersBusy", err)
	}
	e.m.layerMu.RLock() // another reader comes and goes
	//lint:ignore SA2001 a reader that comes and goes, holding nothing
	e.m.layerMu.RUnlock()
	if !lb.has(orphan) {
		t.Errorf("the orphan layer went while the lock was held")
	}
	e.m.layerMu.RUnlock()
	for id := range lb.deleted {
		if id == orphan {
			break
		}
	}
}
