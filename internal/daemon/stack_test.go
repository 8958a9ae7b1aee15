package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/isolation/multi"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/store"
)

type oneTemplate string

func (r oneTemplate) Resolve(string) (string, error) { return string(r), nil }

// nodeManager starts a sandbox manager on a cluster node's backend stack
// (backendStack) over a router of a "native" fake and a "gvisor" fake
// that keeps its paused sandboxes on host, as gVisor does, with a warm
// template pool in front: the wrapping the daemon builds for a node.
func nodeManager(t *testing.T, st *store.Store, gvHost *fake.Host) *sandbox.Manager {
	t.Helper()
	nat := fake.New(fake.Options{Name: BackendNative})
	gv := fake.NewKeeping(fake.Options{Name: BackendGvisor, Host: gvHost})
	routed, err := multi.New(nat, gv)
	if err != nil {
		t.Fatal(err)
	}
	opts := Config{Cluster: &ClusterOptions{Name: "node-a"}, WarmTemplates: []WarmTemplate{{Name: "other"}}}
	pool, tmplPools, layers := backendStack(routed, nil, opts, slog.New(slog.DiscardHandler))
	if _, ok := isolation.As[interface{ Has(string) bool }](pool); !ok {
		t.Error("the node's stack hides its router's Has")
	}
	m, err := sandbox.New(sandbox.Options{Backend: pool, Layers: layers, Store: st,
		Templates: oneTemplate(t.TempDir()), Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range append(tmplPools, pool) {
			p.Close(context.Background())
		}
	})
	return m
}

// TestClusterNodeBackendCapabilities: on a cluster node, a create's
// fence.backend picks the router's backend through the naming wrapper and
// the warm pools, a paused sandbox of a backend that keeps them is left
// by a shutdown, and the next daemon adopts it, paused, and resumes it.
func TestClusterNodeBackendCapabilities(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	gvHost := fake.NewHost()

	m := nodeManager(t, st, gvHost)
	s, err := m.Create(ctx, sandbox.CreateRequest{TemplateID: "base",
		Metadata: map[string]string{sandbox.BackendMetadataKey: BackendGvisor}})
	if err != nil {
		t.Fatalf("Create with %s=%s on a cluster node: %v", sandbox.BackendMetadataKey, BackendGvisor, err)
	}
	if tag, ok := cluster.TagOf(s.ID); !ok || tag != cluster.Tag("node-a") {
		t.Errorf("sandbox %s has no ID of node-a (tag %q)", s.ID, tag)
	}
	if _, ok := gvHost.Sandbox(s.ID); !ok {
		t.Fatalf("sandbox %s is not on the gvisor backend (it has %v)", s.ID, gvHost.Running())
	}
	if err := m.Pauses().Pause(ctx, s.ID, sandbox.WithMemory); err != nil {
		t.Fatalf("Pause(%s) = %v", s.ID, err)
	}
	if err := m.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown() = %v", err)
	}
	if fs, ok := gvHost.Sandbox(s.ID); !ok {
		t.Fatalf("the shutdown killed the kept paused sandbox %s", s.ID)
	} else if paused, _ := fs.Paused(); !paused {
		t.Fatalf("the shutdown left sandbox %s running", s.ID)
	}

	m2 := nodeManager(t, st, gvHost)
	defer m2.Shutdown(context.Background())
	got, err := m2.Get(ctx, s.ID)
	if err != nil || got.State != sandbox.StatePaused {
		t.Fatalf("after a restart Get(%s) = %+v, %v; want it adopted, paused", s.ID, got, err)
	}
	if _, err := m2.Pauses().Resume(ctx, s.ID, time.Minute, nil, sandbox.WithMemory); err != nil {
		t.Fatalf("Resume(%s) after a restart = %v", s.ID, err)
	}
	if fs, ok := gvHost.Sandbox(s.ID); !ok {
		t.Fatalf("sandbox %s is gone after its resume", s.ID)
	} else if paused, _ := fs.Paused(); paused {
		t.Errorf("sandbox %s is still paused after its resume", s.ID)
	}
}
