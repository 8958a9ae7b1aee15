package fake

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/fencesandbox/fence/internal/isolation"
)

// Keeping is a Backend whose paused sandboxes outlive it, as gVisor's
// checkpoint images outlive the daemon that paused them: it implements
// isolation.Adopter, and its sandboxes isolation.Keeper (a paused one is
// kept). A Keeping made on the same Host after a "restart" adopts what an
// earlier one left paused; its Cleanup kills every other sandbox on the
// Host, as Backend's does, but none it adopted.
//
// Its sandboxes are wrappers (Unwrap) of the Host's *Sandbox that hide
// its other capabilities (Pauser): they are found with isolation.As.
type Keeping struct {
	*Backend

	mu sync.Mutex
	// +checklocks:mu
	adopted []string
}

var (
	_ isolation.Backend = (*Keeping)(nil)
	_ isolation.Adopter = (*Keeping)(nil)
)

// NewKeeping returns a fake backend that keeps paused sandboxes.
func NewKeeping(opts Options) *Keeping { return &Keeping{Backend: New(opts)} }

// Create implements isolation.Backend.
func (k *Keeping) Create(ctx context.Context, spec isolation.Spec) (isolation.Sandbox, error) {
	s, err := k.Backend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return keptSandbox{s, s.(*Sandbox)}, nil
}

// Adopt implements isolation.Adopter: it takes over the paused sandbox id
// of the Host. An unknown or running one is ErrNotFound.
func (k *Keeping) Adopt(ctx context.Context, id string, nw isolation.Network) (isolation.Sandbox, error) {
	s, ok := k.host.Sandbox(id)
	if !ok {
		return nil, fmt.Errorf("adopting %s: %w", id, isolation.ErrNotFound)
	}
	if paused, _ := s.Paused(); !paused {
		return nil, fmt.Errorf("adopting %s: not paused: %w", id, isolation.ErrNotFound)
	}
	k.mu.Lock()
	k.adopted = append(k.adopted, id)
	k.mu.Unlock()
	return keptSandbox{s, s}, nil
}

// Cleanup implements isolation.Backend: it kills every sandbox on the
// host that this Keeping did not adopt.
func (k *Keeping) Cleanup(ctx context.Context) ([]string, error) {
	k.mu.Lock()
	adopted := slices.Clone(k.adopted)
	k.mu.Unlock()
	var ids []string
	for _, id := range k.host.Running() {
		s, ok := k.host.Sandbox(id)
		if !ok || slices.Contains(adopted, id) {
			continue
		}
		if err := s.Kill(ctx); err != nil {
			return ids, err
		}
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

// keptSandbox is a sandbox of a Keeping backend.
type keptSandbox struct {
	isolation.Sandbox
	fs *Sandbox
}

var (
	_ isolation.Sandbox = keptSandbox{}
	_ isolation.Keeper  = keptSandbox{}
)

// Kept implements isolation.Keeper: a paused sandbox is kept.
func (s keptSandbox) Kept() bool {
	paused, _ := s.fs.Paused()
	return paused
}

// Unwrap returns the Host's sandbox.
func (s keptSandbox) Unwrap() isolation.Sandbox { return s.Sandbox }
