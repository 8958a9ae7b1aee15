package isolationtest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
)

// RunAll runs every suite of this package that the backends newBackend
// makes can pass, as their capabilities tell (found with isolation.As,
// through any wrapper), and logs each one it skips with what the backend
// lacks for it:
//
//   - Run, always;
//   - RunNetwork and RunPoolNetwork, when the backend attaches the
//     Network of a Spec and its sandboxes' agent runs processes;
//   - RunPause, when its sandboxes are isolation.Pauser and their agent
//     runs processes;
//   - RunPersistentPause, when besides the backend is an isolation.Adopter
//     and its sandboxes isolation.Keeper;
//   - RunLayers, when the backend implements isolation.Layers, its
//     sandboxes isolation.Checkpointer and their agent runs processes,
//     and RunMemoryLayers too when they are isolation.FileCheckpointer
//     (their Checkpoint keeps memory).
//
// The agent of the fake backend (isolation/fake) runs no processes. The
// capabilities are read from one backend and one sandbox made before the
// suites run, on rootfs.
func RunAll(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	var c caps
	if !t.Run("Capabilities", func(t *testing.T) { c = probe(t, newBackend, rootfs) }) {
		return
	}
	Run(t, newBackend, rootfs)
	suites := []struct {
		name  string
		lacks string // what the backend lacks for it; "" runs it
		run   func(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string)
	}{
		{"Network", c.lacksNetwork(), RunNetwork},
		{"PoolNetwork", c.lacksNetwork(), RunPoolNetwork},
		{"Pause", c.lacksPause(), RunPause},
		{"PersistentPause", c.lacksPersistentPause(), RunPersistentPause},
		{"Layers", c.lacksLayers(false), RunLayers},
		{"MemoryLayers", c.lacksLayers(true), RunMemoryLayers},
	}
	for _, s := range suites {
		if s.lacks != "" {
			t.Logf("skipping the %s suite: %s", s.name, s.lacks)
			continue
		}
		t.Run(s.name, func(t *testing.T) { s.run(t, newBackend, rootfs) })
	}
}

// caps are the capabilities of a backend and its sandboxes.
type caps struct {
	backend         string
	attaches        bool // Create attaches Spec.Network
	processes       bool // the agent runs processes
	pauser, keeper  bool
	adopter, layers bool
	checkpointer    bool
	memory          bool // FileCheckpointer: Checkpoint keeps memory
}

func probe(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) caps {
	b := newBackend(t)
	nw := &attachProbe{Network: Network(nil)}
	s, err := b.Create(t.Context(), isolation.Spec{ID: NewID(), RootFS: rootfs, Network: nw})
	if err != nil {
		t.Fatalf("Create() = %v", err)
	}
	defer s.Kill(context.WithoutCancel(t.Context()))
	_, isFake := isolation.As[*fake.Sandbox](s)
	c := caps{backend: b.Name(), attaches: nw.attached.Load(), processes: !isFake}
	_, c.pauser = isolation.As[isolation.Pauser](s)
	_, c.keeper = isolation.As[isolation.Keeper](s)
	_, c.checkpointer = isolation.As[isolation.Checkpointer](s)
	_, c.memory = isolation.As[isolation.FileCheckpointer](s)
	_, c.adopter = isolation.As[isolation.Adopter](b)
	// Layers is found on the backend itself: a wrapper that changes how
	// sandboxes are made hands its layers over apart (isolation.As).
	_, c.layers = b.(isolation.Layers)
	t.Logf("%s (%T): %+v", c.backend, b, c)
	return c
}

func (c caps) lacksNetwork() string {
	switch {
	case !c.attaches:
		return "its Create attaches no network namespace to the Spec's Network"
	case !c.processes:
		return "its agent runs no processes"
	}
	return ""
}

func (c caps) lacksPause() string {
	switch {
	case !c.pauser:
		return "its sandboxes do not implement isolation.Pauser"
	case !c.processes:
		return "its agent runs no processes"
	}
	return ""
}

func (c caps) lacksPersistentPause() string {
	switch {
	case !c.adopter:
		return "it does not implement isolation.Adopter"
	case !c.keeper:
		return "its sandboxes do not implement isolation.Keeper"
	}
	return c.lacksPause()
}

func (c caps) lacksLayers(memory bool) string {
	switch {
	case !c.layers:
		return "it does not implement isolation.Layers"
	case !c.checkpointer:
		return "its sandboxes do not implement isolation.Checkpointer"
	case !c.processes:
		return "its agent runs no processes"
	case memory && !c.memory:
		return "its checkpoints keep no memory (no isolation.FileCheckpointer)"
	}
	return ""
}

// attachProbe is a Network that records whether a backend attached to it.
type attachProbe struct {
	isolation.Network
	attached atomic.Bool
}

func (p *attachProbe) Attach(ctx context.Context, id, nsPath string, kernelPeer bool) (isolation.Link, error) {
	p.attached.Store(true)
	return p.Network.Attach(ctx, id, nsPath, kernelPeer)
}
