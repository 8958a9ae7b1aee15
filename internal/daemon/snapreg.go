package daemon

import (
	"fmt"

	"github.com/fencesandbox/fence/internal/contentreg"
	"github.com/fencesandbox/fence/internal/isolation/gvisor"
	"github.com/fencesandbox/fence/internal/isolation/multi"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/timetravel"
	"github.com/fencesandbox/fence/internal/snapreg"
)

// snapshotStore returns the store of the keeper's snapshot records: with
// a shared database and the cluster's registry, the cluster's
// (internal/snapreg: layers pushed to the registry, pulled by the node
// that needs them); else the node's own.
func (d *node) snapshotStore(templates sandbox.Templates) (timetravel.LayerStore, error) {
	content, err := d.contentRegistry()
	if err != nil || content == nil || !d.st.Shared() {
		return d.st, err
	}
	movers := map[string]snapreg.Mover{"native": d.native}
	if m, ok := d.routed.(*multi.Backend); ok {
		for _, b := range m.Backends() {
			if gv, ok := b.(*gvisor.Backend); ok {
				movers[gv.Name()] = gv
			}
		}
	}
	return snapreg.New(snapreg.Options{Store: d.st, Content: content, Movers: movers,
		Owner: snapreg.OwnerByPrefix(gvisor.LayerPrefix, "gvisor", "native"), Templates: templates,
		Node: d.nodeName(), Logger: d.log})
}

// contentRegistry is the cluster's content registry (fence serve
// --registry), or nil.
func (d *node) contentRegistry() (snapreg.Content, error) {
	if d.opts.Registry == "" {
		return nil, nil
	}
	r, err := contentreg.New(contentreg.Options{URL: d.opts.Registry, Logger: d.log})
	if err != nil {
		return nil, fmt.Errorf("the content registry: %w", err)
	}
	return r, nil
}
