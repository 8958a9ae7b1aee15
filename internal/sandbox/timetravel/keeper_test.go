package timetravel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/store"
)

type templates map[string]string

func (ts templates) Resolve(name string) (string, error) {
	if p, ok := ts[name]; ok {
		return p, nil
	}
	return "", fmt.Errorf("template %q: %w", name, api.ErrNotFound)
}

// env is a sandbox manager on a fake backend with in-memory layers
// (layerBackend), with a Keeper given to it (sandbox.New binds it) and
// started.
type env struct {
	m     *sandbox.Manager
	k     *Keeper
	lb    *layerBackend
	store *store.Store
}

func newEnv(t *testing.T) *env {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	tmpls := templates{"base": "/rootfs/base", "minimal": "/rootfs/minimal"}
	lb := newLayerBackend(fake.New(fake.Options{Host: fake.NewHost()}))
	k := New(Options{Store: st, Templates: tmpls, Logger: log})
	m, err := sandbox.New(sandbox.Options{Backend: lb, Store: st, Templates: tmpls, Logger: log, Keeper: k})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatalf("Start() = %v", err)
	}
	if err := k.Start(t.Context()); err != nil {
		t.Fatalf("Keeper.Start() = %v", err)
	}
	t.Cleanup(func() {
		m.Shutdown(context.Background())
		k.Close()
		st.Close()
	})
	return &env{m: m, k: k, lb: lb, store: st}
}

// sandbox.New binds the Keeper it is given to the manager it makes, with
// nothing more to call: the Keeper snapshots that manager's sandboxes.
// A Keeper serves one manager: given to a second, New panics.
func TestNewBindsTheKeeper(t *testing.T) {
	e := newEnv(t)
	sb := e.mustCreate(t, sandbox.CreateRequest{})
	sn, err := e.k.CreateSnapshot(t.Context(), sb.ID, "")
	if err != nil {
		t.Fatalf("Snapshot of the bound manager's sandbox = %v", err)
	}
	if got := e.mustCreate(t, sandbox.CreateRequest{TemplateID: sn.SnapshotID}); got.ID == "" {
		t.Fatal("no sandbox from the snapshot")
	}
	defer func() {
		if recover() == nil {
			t.Error("sandbox.New bound a Keeper to a second manager")
		}
	}()
	_, _ = sandbox.New(sandbox.Options{Backend: e.lb, Store: e.store, Templates: templates{"base": "/rootfs/base"}, Keeper: e.k})
}

func (e *env) mustCreate(t *testing.T, req sandbox.CreateRequest) *sandbox.Sandbox {
	t.Helper()
	if req.TemplateID == "" {
		req.TemplateID = "base"
	}
	s, err := e.m.Create(t.Context(), req)
	if err != nil {
		t.Fatalf("Create(%+v) = %v", req, err)
	}
	return s
}

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
	// bootsStandbys makes the sandboxes created from here boot standbys
	// (isolation.StandbyBooter); standbys receives each standby booted
	// (buffered).
	bootsStandbys atomic.Bool
	standbys      chan *standbyBox
}

var (
	_ isolation.Layers       = (*layerBackend)(nil)
	_ isolation.Checkpointer = (*layerBox)(nil)
)

func newLayerBackend(b *fake.Backend) *layerBackend {
	return &layerBackend{Backend: b, layers: map[string]isolation.LayerInfo{}, deleted: make(chan string, 100),
		standbys: make(chan *standbyBox, 100), onRead: func(context.Context, string) {}}
}

func (b *layerBackend) Create(ctx context.Context, spec isolation.Spec) (isolation.Sandbox, error) {
	return b.CreateOn(ctx, spec, "")
}

func (b *layerBackend) CreateOn(ctx context.Context, spec isolation.Spec, layer string) (isolation.Sandbox, error) {
	if layer != "" && !b.has(layer) {
		return nil, fmt.Errorf("layer %s: %w", layer, isolation.ErrNotFound)
	}
	if spec.Standby {
		sb := &standbyBox{id: spec.ID, done: make(chan struct{})}
		b.standbys <- sb
		return sb, nil
	}
	s, err := b.Backend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	box := &layerBox{Sandbox: s, b: b, base: layer}
	if b.bootsStandbys.Load() {
		return &standbyBooterBox{box}, nil
	}
	return box, nil
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

// Unwrap gives the fake sandbox's capabilities (pause) through the box.
func (s *layerBox) Unwrap() isolation.Sandbox { return s.Sandbox }

// standbyBooterBox is a layerBox whose backend boots standbys.
type standbyBooterBox struct{ *layerBox }

func (standbyBooterBox) BootsStandby() {}

// standbyBox is a standby the layerBackend booted: it runs nothing, and
// Done is closed once it is killed.
type standbyBox struct {
	id   string
	once sync.Once
	done chan struct{}
}

func (s *standbyBox) ID() string { return s.id }
func (s *standbyBox) DialAgent(context.Context) (net.Conn, error) {
	return nil, errors.New("a standby is not dialed")
}
func (s *standbyBox) DialPort(context.Context, uint16) (net.Conn, error) {
	return nil, errors.New("a standby is not dialed")
}
func (s *standbyBox) Stats(context.Context) (isolation.Stats, error) { return isolation.Stats{}, nil }
func (s *standbyBox) Kill(context.Context) error {
	s.once.Do(func() { close(s.done) })
	return nil
}
func (s *standbyBox) Done() <-chan struct{} { return s.done }

// TestDiffReadsWithoutLayerLock: a diff reads the files of its layers
// without the layer lock, so that, while one diff is in the middle of
// its reading (held in the backend's LayerChanges), the layer collector
// runs and a checkpoint of another sandbox completes (a collector
// waiting for the lock would hold every other layer operation back); the
// layer the diff reads, its record deleted meanwhile, is kept until the
// diff is done, and collected then.
func TestDiffReadsWithoutLayerLock(t *testing.T) {
	e := newEnv(t)
	lb := e.lb
	ctx := t.Context()
	a, b := e.mustCreate(t, sandbox.CreateRequest{}), e.mustCreate(t, sandbox.CreateRequest{})
	cp, err := e.k.CreateCheckpoint(ctx, a.ID, "one", false)
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
		d, err := e.k.Diff(ctx, a.ID, cp.ID, "now")
		done <- result{d, err}
	}()
	<-reading
	if !e.k.lock.mu.TryLock() {
		close(release)
		<-done
		t.Fatalf("a diff holds the layer lock while it reads its layers")
	}
	e.k.lock.mu.Unlock() // +checklocksignore: taken by TryLock above
	// The checkpoint's record goes; the collector keeps its layer while
	// the diff reads it.
	if err := e.store.DeleteCheckpoints(ctx, a.ID, cp.ID); err != nil {
		t.Fatal(err)
	}
	if err := collect(ctx, e.k); err != nil {
		t.Errorf("gc while a diff reads = %v", err)
	}
	if !lb.has(layer) {
		t.Errorf("gc deleted layer %s while a diff read it", layer)
	}
	if _, err := e.k.CreateCheckpoint(ctx, b.ID, "", false); err != nil {
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
func collect(ctx context.Context, k *Keeper) error {
	for {
		err := k.gc(ctx)
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
	e := newEnv(t)
	lb := e.lb
	ctx := t.Context()
	orphan := isolation.NewID()
	lb.mu.Lock()
	lb.layers[orphan] = isolation.LayerInfo{ID: orphan, Depth: 1}
	lb.mu.Unlock()

	e.k.lock.RLock() // a checkpoint being made
	if err := e.k.gc(ctx); !errors.Is(err, errLayersBusy) {
		t.Errorf("gc under a reader = %v, want errLayersBusy", err)
	}
	e.k.lock.RLock() // another reader comes and goes
	//lint:ignore SA2001 a reader that comes and goes, holding nothing
	e.k.lock.RUnlock()
	if !lb.has(orphan) {
		t.Errorf("the orphan layer went while the lock was held")
	}
	e.k.lock.RUnlock()
	for id := range lb.deleted {
		if id == orphan {
			break
		}
	}
}
