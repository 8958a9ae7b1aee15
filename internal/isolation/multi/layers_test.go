package multi_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/isolation/multi"
)

// layered is a backend keeping the named layers; owner makes it an
// isolation.LayerOwner too.
type layered struct {
	*fake.Backend
	name   string
	layers []string
	booted []string // layers CreateOn was called with
}

func (l *layered) Name() string { return l.name }
func (l *layered) CreateOn(ctx context.Context, spec isolation.Spec, layer string) (isolation.Sandbox, error) {
	if layer != "" && !slices.Contains(l.layers, layer) {
		return nil, isolation.ErrNotFound
	}
	l.booted = append(l.booted, layer)
	return l.Backend.Create(ctx, spec)
}
func (l *layered) LayerChanges(context.Context, string) ([]isolation.FileChange, error) {
	return nil, nil
}
func (l *layered) ListLayers(context.Context) ([]isolation.LayerInfo, error) {
	var out []isolation.LayerInfo
	for _, id := range l.layers {
		out = append(out, isolation.LayerInfo{ID: id})
	}
	return out, nil
}
func (l *layered) DeleteLayer(_ context.Context, id string) error {
	l.layers = slices.DeleteFunc(l.layers, func(s string) bool { return s == id })
	return nil
}

type owner struct{ *layered }

func (o owner) HasLayer(id string) bool { return slices.Contains(o.layers, id) }

// TestLayersRouteToOwner checks the layer router: a layer goes to the
// backend that owns it (LayerOwner) or else to the one that cannot tell;
// a Spec naming another backend than the layer's is refused; lists are
// the union; deletes go to the owner; no layers, no router.
func TestLayersRouteToOwner(t *testing.T) {
	nat := &layered{Backend: fake.New(fake.Options{}), name: "native", layers: []string{"n1"}}
	gv := owner{&layered{Backend: fake.New(fake.Options{}), name: "gvisor", layers: []string{"gv1"}}}
	r, err := multi.New(nat, gv)
	if err != nil {
		t.Fatal(err)
	}
	l := r.Layers()
	ctx := t.Context()
	tests := []struct {
		name, layer, backend string
		want                 *layered
		wantErr              string
	}{
		{"gvisor layer", "gv1", "", gv.layered, ""},
		{"gvisor layer, gvisor named", "gv1", "gvisor", gv.layered, ""},
		{"native layer", "n1", "", nat, ""},
		{"gvisor layer, native named", "gv1", "native", nil, "not the native backend's"},
		{"no layer, gvisor named", "", "gvisor", gv.layered, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(tt.want.bootedOrNil())
			s, err := l.CreateOn(ctx, isolation.Spec{RootFS: "/", Backend: tt.backend}, tt.layer)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("CreateOn(%q, backend %q) = %v, want error %q", tt.layer, tt.backend, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("CreateOn(%q, backend %q) = %v", tt.layer, tt.backend, err)
			}
			defer s.Kill(ctx)
			if got := tt.want.booted; len(got) != before+1 || got[len(got)-1] != tt.layer {
				t.Errorf("CreateOn(%q) reached %s with %v", tt.layer, tt.want.name, got)
			}
		})
	}
	all, err := l.ListLayers(ctx)
	if err != nil || len(all) != 2 {
		t.Errorf("ListLayers() = %v, %v; want both backends' layers", all, err)
	}
	if err := l.DeleteLayer(ctx, "gv1"); err != nil || len(gv.layers) != 0 || len(nat.layers) != 1 {
		t.Errorf("DeleteLayer(gv1) = %v: gvisor %v, native %v", err, gv.layers, nat.layers)
	}
	if r2, _ := multi.New(fake.New(fake.Options{})); r2.Layers() != nil {
		t.Errorf("Layers() of backends without layers is not nil")
	}
	if _, err := l.CreateOn(ctx, isolation.Spec{RootFS: "/"}, "nosuch"); !errors.Is(err, isolation.ErrNotFound) {
		t.Errorf("CreateOn(unknown layer) = %v, want ErrNotFound", err)
	}
}

func (l *layered) bootedOrNil() []string {
	if l == nil {
		return nil
	}
	return l.booted
}
