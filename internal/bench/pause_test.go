package bench

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/testutil"
)

// The pause measure times a sandbox that holds pauseFillMiB from the
// moment its fill says it is done until after its last resume. Its shell
// once exec'd its last command (sleep) in place of itself, dropping the
// memory a moment after filling it: the measure timed a sandbox of 1 MiB,
// and failed when its readings missed that moment.
func TestPauseMeasureHoldsTheMemory(t *testing.T) {
	testutil.RequireRoot(t)
	b, err := native.New(t.Context(), native.Options{
		StateDir:   filepath.Join(testutil.StateDir(t), "native"),
		Instance:   "testbenchpause",
		ReadyInits: 1, // the bench's backend keeps ready inits too
		Ephemeral:  true,
		Network:    isolationtest.Network(nil),
		Executable: testutil.FenceBinary(t),
	})
	if err != nil {
		t.Fatalf("native.New: %v", err)
	}
	t.Cleanup(func() {
		b.Cleanup(context.Background())
		b.Close()
	})
	rs := fencePause(t.Context(), Options{Backend: b, RootFS: testutil.RootFS(t, "minimal"), Iterations: 2})
	if len(rs) != 2 {
		t.Fatalf("fencePause returned %d results, want pause and resume: %v", len(rs), rs[0].Err)
	}
	for _, r := range rs {
		if r.Err != nil {
			t.Errorf("%s: %v", r.Name, r.Err)
		} else if len(r.Samples) != 2 || !strings.Contains(r.Name, "100 MiB in use") {
			t.Errorf("%s: %d samples, want 2", r.Name, len(r.Samples))
		}
	}
}
