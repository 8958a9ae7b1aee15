// Package multi puts several isolation backends behind one
// isolation.Backend, so one daemon can run sandboxes on each: Create uses
// the backend the Spec names (Spec.Backend), or the default one.
//
// # Guarantees
//
//   - A Spec naming no backend goes to the default; one naming an unknown
//     backend is refused before anything is made.
//   - Cleanup runs every backend's Cleanup; Adopt asks every backend that
//     can adopt. Each sandbox stays the one its backend returned, with
//     that backend's optional capabilities (pause, layers).
package multi

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/fencesandbox/fence/internal/isolation"
)

// Backend routes to one of several backends.
type Backend struct {
	def   isolation.Backend
	all   []isolation.Backend
	names []string
}

var (
	_ isolation.Backend = (*Backend)(nil)
	_ isolation.Adopter = (*Backend)(nil)
)

// New returns a router whose default is def; others are selectable by
// name. Names must be distinct.
func New(def isolation.Backend, others ...isolation.Backend) (*Backend, error) {
	b := &Backend{def: def}
	for _, x := range append([]isolation.Backend{def}, others...) {
		if slices.Contains(b.names, x.Name()) {
			return nil, fmt.Errorf("two backends named %q", x.Name())
		}
		b.all = append(b.all, x)
		b.names = append(b.names, x.Name())
	}
	return b, nil
}

// Name implements isolation.Backend: the default backend's name.
func (b *Backend) Name() string { return b.def.Name() }

// Names returns the backends' names, the default first.
func (b *Backend) Names() []string { return slices.Clone(b.names) }

// Has reports whether a backend is named name.
func (b *Backend) Has(name string) bool { return slices.Contains(b.names, name) }

// Create implements isolation.Backend.
func (b *Backend) Create(ctx context.Context, spec isolation.Spec) (isolation.Sandbox, error) {
	if spec.Backend == "" {
		return b.def.Create(ctx, spec)
	}
	i := slices.Index(b.names, spec.Backend)
	if i < 0 {
		return nil, fmt.Errorf("unknown backend %q (have %v)", spec.Backend, b.names)
	}
	spec.Backend = ""
	return b.all[i].Create(ctx, spec)
}

// Cleanup implements isolation.Backend.
func (b *Backend) Cleanup(ctx context.Context) ([]string, error) {
	var ids []string
	var errs []error
	for _, x := range b.all {
		got, err := x.Cleanup(ctx)
		ids = append(ids, got...)
		if err != nil {
			errs = append(errs, fmt.Errorf("backend %s: %w", x.Name(), err))
		}
	}
	return ids, errors.Join(errs...)
}

// Adopt implements isolation.Adopter.
func (b *Backend) Adopt(ctx context.Context, id string, nw isolation.Network) (isolation.Sandbox, error) {
	var errs []error
	for _, x := range b.all {
		a, ok := isolation.As[isolation.Adopter](x)
		if !ok {
			continue
		}
		s, err := a.Adopt(ctx, id, nw)
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("no backend keeps paused sandboxes: %w", isolation.ErrNotFound)
	}
	return nil, errors.Join(errs...)
}
