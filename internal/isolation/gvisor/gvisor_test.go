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

// TestConformance runs every suite gVisor's capabilities allow
// (isolationtest.RunAll): the network cases (a resume attaches a new
// namespace), pauses (a checkpoint there) and pauses that outlive their
// daemon, the cases every isolation.Layers backend passes (a checkpoint
// being a whole memory image there), and layers that keep memory
// (snapshots and forks of running sandboxes).
func TestConformance(t *testing.T) {
	testutil.RequireRunsc(t)
	rootfs := testutil.RootFS(t, "minimal")
	isolationtest.RunAll(t, stateFactory(t), rootfs)
}

// TestPauseConformance runs the isolation.Pauser cases on gVisor
// sandboxes handed out by a warm pool in front of the backend.
func TestPauseConformance(t *testing.T) {
	testutil.RequireRunsc(t)
	rootfs := testutil.RootFS(t, "minimal")
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
}
