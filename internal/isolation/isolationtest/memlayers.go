package isolationtest

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
)

// RunMemoryLayers runs the cases of a backend whose layers keep memory and
// processes (LayerInfo.Memory, gVisor's checkpoint images): a checkpoint
// leaves its sandbox running; every sandbox booted on it goes on where the
// source was (a shell loop keeps counting from its value in memory, files
// are the checkpoint's); they are independent of each other and of the
// source (files and processes); each one's agent has its own spec's
// configuration, not the source's; and deleting the layer, or killing
// the source, leaves them running.
func RunMemoryLayers(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	h, src, cp := newLayerHarness(t, newBackend, rootfs)
	l, sh := h.l, h.sh
	// A value only the loop's memory holds: the count goes on from it.
	sh(src, `mkdir -p /data && echo one > /data/a && `+counterLoop)
	before := waitAdvance(t, src, 0)
	info, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatalf("Checkpoint() = %v", err)
	}
	if !info.Memory || info.Bytes == 0 {
		t.Errorf("Checkpoint() = %+v, want a memory layer with bytes", info)
	}
	// The source runs on.
	waitAdvance(t, src, before)
	sh(src, `echo later > /data/a`)

	forks := h.forks(info.ID, 3)
	for i, s := range forks {
		// The loop was restored: it counts on from at least where it was.
		c := readCounter(t, s)
		if c < before {
			t.Errorf("fork %d: counter %d, below %d at the checkpoint: the loop did not go on", i, c, before)
		}
		waitAdvance(t, s, c)
		if got := sh(s, `cat /data/a`); got != "one\n" {
			t.Errorf("fork %d reads /data/a = %q, want one (the checkpoint's)", i, got)
		}
		if got := sh(s, `echo "$FORK"`); got != strconv.Itoa(i)+"\n" {
			t.Errorf("fork %d: FORK=%q in a new command, want its spec's %d", i, got, i)
		}
		if got := strings.TrimSpace(sh(s, `hostname`)); got != s.ID() {
			t.Logf("fork %d: hostname %q (its ID %s)", i, got, s.ID())
		}
	}
	h.checkIndependent(src, forks)
	// Deleting the layer and killing the source leave the forks running.
	if err := l.DeleteLayer(t.Context(), info.ID); err != nil {
		t.Fatalf("DeleteLayer(%s) = %v", info.ID, err)
	}
	if err := src.Kill(t.Context()); err != nil {
		t.Fatalf("Kill(source) = %v", err)
	}
	for i, s := range forks {
		c := readCounter(t, s)
		waitAdvance(t, s, c)
		if got := sh(s, `head -c 1000000 /dev/zero | wc -c`); strings.TrimSpace(got) != "1000000" {
			t.Errorf("fork %d after the layer's delete: %q", i, got)
		}
	}
	h.checkDeleted(info.ID)
}

// forks boots n sandboxes on layer at once, each with FORK set to its
// index in its agent's environment, killed at the test's end.
func (h *layerHarness) forks(layer string, n int) []isolation.Sandbox {
	t := h.t
	t.Helper()
	forks := make([]isolation.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range forks {
		wg.Go(func() {
			spec := isolation.Spec{ID: NewID(), RootFS: h.rootfs,
				Agent: isolation.AgentConfig{EnvVars: map[string]string{"FORK": strconv.Itoa(i)}}}
			forks[i], errs[i] = h.l.CreateOn(t.Context(), spec, layer)
		})
	}
	wg.Wait()
	for i, s := range forks {
		if errs[i] != nil {
			t.Fatalf("CreateOn(%s) #%d = %v", layer, i, errs[i])
		}
		t.Cleanup(func() { s.Kill(context.WithoutCancel(t.Context())) })
	}
	return forks
}

// checkIndependent checks that a file and a process of the first fork
// are nowhere else: not in the source, not in the other forks.
func (h *layerHarness) checkIndependent(src isolation.Sandbox, forks []isolation.Sandbox) {
	t, sh := h.t, h.sh
	t.Helper()
	sh(forks[0], `echo mine > /data/a && (sleep 3003 </dev/null >/dev/null 2>&1 &)`)
	for i, s := range append([]isolation.Sandbox{src}, forks[1:]...) {
		if got := sh(s, `cat /data/a`); got == "mine\n" {
			t.Errorf("sandbox %d sees fork 0's write", i)
		}
		if got := sh(s, `ps -o args 2>/dev/null || ps`); strings.Contains(got, "sleep 3003") {
			t.Errorf("sandbox %d sees fork 0's process:\n%s", i, got)
		}
	}
	if got := sh(forks[0], `ps -o args 2>/dev/null || ps`); !strings.Contains(got, "sleep 3003") {
		t.Errorf("fork 0 does not see its own process:\n%s", got)
	}
}
