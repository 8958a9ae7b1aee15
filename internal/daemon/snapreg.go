package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/httpapi"
	"github.com/fencesandbox/fence/internal/tenancy"

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
	moves, err := snapreg.New(snapreg.Options{Store: d.st, Content: content, Movers: movers,
		Owner: snapreg.OwnerByPrefix(gvisor.LayerPrefix, "gvisor", "native"), Templates: templates,
		Node: d.nodeName(), Logger: d.log})
	if err != nil {
		return nil, err
	}
	d.moves = moves
	return moves, nil
}

// pauser is the API's pause and resume: the manager's, which also takes
// over a sandbox moved off a drained node when the node has a registry.
func (d *node) pauser() httpapi.Pauser {
	if d.moves == nil {
		return d.mgr.Pauses()
	}
	return snapreg.Arriving{Pauses: d.mgr.Pauses(), Moves: d.moves}
}

// locator answers where moved sandboxes went, or nil without a registry.
func (d *node) locator() httpapi.Locator {
	if d.moves == nil {
		return nil
	}
	return d.moves
}

// watchDrain, with --drain-moves, moves the node's sandboxes into the
// registry each time the operator drains the node (fence.dev/drain=true on
// its Lease), until ctx is done.
func (d *node) watchDrain(ctx context.Context, lease *cluster.Registrar) {
	if !d.opts.DrainMoves || d.moves == nil {
		return
	}
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		drained := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := lease.DrainRequested()
			if now && !drained {
				d.drainMoves(ctx)
			}
			drained = now
		}
	}()
}

// drainMoves moves every sandbox of the node (but template builds') into
// the registry.
func (d *node) drainMoves(ctx context.Context) {
	list, err := d.mgr.List(tenancy.NewContext(ctx, tenancy.Principal{}),
		sandbox.ListFilter{WithoutMetadataKeys: []string{sandbox.BuildMetadataKey}})
	if err != nil {
		d.log.Error("listing the sandboxes of the drained node", "err", err)
		return
	}
	ids := make([]string, len(list))
	for i, s := range list {
		ids[i] = s.ID
	}
	d.log.Info("node drained: moving its sandboxes to the registry", "sandboxes", len(ids))
	moved := d.moves.Drain(ctx, d.mgr.Pauses(), ids)
	d.log.Info("node drained: sandboxes moved to the registry", "moved", moved, "stayed", len(ids)-moved)
}

// contentRegistry is the cluster's content registry (fence serve
// --registry), or nil.
func (d *node) contentRegistry() (snapreg.Content, error) {
	o := d.opts.Registry
	if o == nil {
		return nil, nil
	}
	r, err := contentreg.New(contentreg.Options{URL: o.URL, CAFile: o.CAFile, Username: o.Username, Password: o.Password, Logger: d.log})
	if err != nil {
		return nil, fmt.Errorf("the content registry: %w", err)
	}
	return r, nil
}
