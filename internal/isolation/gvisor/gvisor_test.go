package gvisor_test

// These tests run real gVisor sandboxes (runsc on the systrap platform).
// They need root (cgroups, network namespaces, runsc) and runsc, which
// scripts/build-runsc.sh builds into /var/lib/fence/cache/runsc.

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/gvisor"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/isolation/warm"
	"github.com/fencesandbox/fence/internal/testutil"
)

// newBackendIn returns a gvisor backend on the state directory dir; the
// instance is the test's, so that backends made on one dir share state.
func newBackendIn(t *testing.T, dir string) *gvisor.Backend {
	t.Helper()
	runsc := testutil.RequireRunsc(t)
	b, err := gvisor.New(t.Context(), gvisor.Options{
		StateDir:   dir,
		Instance:   "test" + strings.ToLower(strings.NewReplacer("/", "", "_", "").Replace(t.Name())),
		Runsc:      runsc,
		Executable: testutil.FenceBinary(t),
		Network:    isolationtest.Network(nil),
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatalf("gvisor.New: %v", err)
	}
	t.Cleanup(func() {
		if _, err := b.Cleanup(context.Background()); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
		b.Close()
	})
	return b
}

// stateFactory returns a factory of backends sharing one state directory.
func stateFactory(t *testing.T) func(t *testing.T) isolation.Backend {
	dir := filepath.Join(testutil.StateDir(t), "state")
	return func(t *testing.T) isolation.Backend { return newBackendIn(t, dir) }
}

func TestConformance(t *testing.T) {
	testutil.RequireRunsc(t)
	rootfs := testutil.RootFS(t, "minimal")
	isolationtest.Run(t, stateFactory(t), rootfs)
}

// TestNetworkConformance runs the network fence cases on gVisor sandboxes
// (a resume attaches a new namespace), and on one handed out by a warm
// pool in front of the backend.
func TestNetworkConformance(t *testing.T) {
	testutil.RequireRunsc(t)
	rootfs := testutil.RootFS(t, "minimal")
	isolationtest.RunNetwork(t, stateFactory(t), rootfs)
	isolationtest.RunPoolNetwork(t, stateFactory(t), rootfs)
}

// TestPauseConformance runs the isolation.Pauser cases on gVisor
// sandboxes (a pause is a checkpoint there), directly and through a warm
// pool, and the cases of pauses that outlive their daemon.
func TestPauseConformance(t *testing.T) {
	testutil.RequireRunsc(t)
	rootfs := testutil.RootFS(t, "minimal")
	t.Run("Direct", func(t *testing.T) {
		isolationtest.RunPause(t, stateFactory(t), rootfs)
	})
	t.Run("WarmPool", func(t *testing.T) {
		f := stateFactory(t)
		isolationtest.RunPause(t, func(t *testing.T) isolation.Backend {
			p := warm.New(warm.Options{Backend: f(t), Size: 1})
			p.Start(warm.Target{RootFS: rootfs}, nil)
			if err := p.WaitReady(t.Context()); err != nil {
				t.Fatalf("WaitReady: %v", err)
			}
			t.Cleanup(func() { p.Close(context.Background()) })
			return p
		}, rootfs)
	})
	t.Run("Persistent", func(t *testing.T) {
		isolationtest.RunPersistentPause(t, stateFactory(t), rootfs)
	})
}

// TestLayersConformance runs the cases every isolation.Layers backend
// passes (files of a checkpoint, stacking, independence, deletion) on
// gVisor's checkpoint layers.
func TestLayersConformance(t *testing.T) {
	testutil.RequireRunsc(t)
	rootfs := testutil.RootFS(t, "minimal")
	isolationtest.RunLayers(t, stateFactory(t), rootfs)
}

// TestMemoryLayers runs the cases of layers that keep memory: snapshots
// and forks of running gVisor sandboxes.
func TestMemoryLayers(t *testing.T) {
	testutil.RequireRunsc(t)
	rootfs := testutil.RootFS(t, "minimal")
	isolationtest.RunMemoryLayers(t, stateFactory(t), rootfs)
}
