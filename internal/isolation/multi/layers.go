package multi

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/fencesandbox/fence/internal/isolation"
)

// Layers returns the backends' layers behind one isolation.Layers, or nil
// when no backend keeps layers. Each layer goes to the backend that owns
// it: the one whose isolation.LayerOwner says so, else the first backend
// keeping layers that cannot tell (the default first). A Spec naming a
// backend other than the layer's is refused.
func (b *Backend) Layers() isolation.Layers {
	r := &layers{}
	for _, x := range b.all {
		if l, ok := x.(isolation.Layers); ok {
			r.all = append(r.all, l)
			r.names = append(r.names, x.Name())
		}
	}
	if len(r.all) == 0 {
		return nil
	}
	return r
}

type layers struct {
	all   []isolation.Layers
	names []string
}

var _ isolation.Layers = (*layers)(nil)

// owner returns the index of the backend owning layer.
func (r *layers) owner(layer string) int {
	fallback := -1
	for i, l := range r.all {
		if o, ok := isolation.As[isolation.LayerOwner](l); ok {
			if o.HasLayer(layer) {
				return i
			}
		} else if fallback < 0 {
			fallback = i
		}
	}
	return fallback
}

func (r *layers) pick(layer string) (isolation.Layers, string, error) {
	i := r.owner(layer)
	if i < 0 {
		return nil, "", fmt.Errorf("layer %s: %w", layer, isolation.ErrNotFound)
	}
	return r.all[i], r.names[i], nil
}

// CreateOn implements isolation.Layers.
func (r *layers) CreateOn(ctx context.Context, spec isolation.Spec, layer string) (isolation.Sandbox, error) {
	if layer == "" {
		i := slices.Index(r.names, spec.Backend)
		if spec.Backend == "" {
			i = 0
		}
		if i < 0 {
			return nil, fmt.Errorf("unknown backend %q (have %v)", spec.Backend, r.names)
		}
		spec.Backend = ""
		return r.all[i].CreateOn(ctx, spec, "")
	}
	l, name, err := r.pick(layer)
	if err != nil {
		return nil, err
	}
	if spec.Backend != "" && spec.Backend != name {
		return nil, fmt.Errorf("layer %s is the %s backend's, not the %s backend's: %w", layer, name, spec.Backend, isolation.ErrUnsupported)
	}
	spec.Backend = ""
	return l.CreateOn(ctx, spec, layer)
}

// LayerChanges implements isolation.Layers.
func (r *layers) LayerChanges(ctx context.Context, layer string) ([]isolation.FileChange, error) {
	l, _, err := r.pick(layer)
	if err != nil {
		return nil, err
	}
	return l.LayerChanges(ctx, layer)
}

// ListLayers implements isolation.Layers: every backend's.
func (r *layers) ListLayers(ctx context.Context) ([]isolation.LayerInfo, error) {
	var out []isolation.LayerInfo
	for i, l := range r.all {
		got, err := l.ListLayers(ctx)
		if err != nil {
			return nil, fmt.Errorf("backend %s: %w", r.names[i], err)
		}
		out = append(out, got...)
	}
	return out, nil
}

// DeleteLayer implements isolation.Layers.
func (r *layers) DeleteLayer(ctx context.Context, id string) error {
	l, _, err := r.pick(id)
	if errors.Is(err, isolation.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return l.DeleteLayer(ctx, id)
}
