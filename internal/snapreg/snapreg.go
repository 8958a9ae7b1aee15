// Package snapreg keeps a cluster's snapshots in its OCI registry, so that
// a snapshot taken on one node starts sandboxes on any node.
//
// A Store stands in for the node's store as the timetravel.Keeper's
// LayerStore when the nodes share one database and one registry
// (fence serve --database … --registry …). A snapshot's layers (the layer
// the snapshot made and the layers it sits on; on gVisor one checkpoint
// image, memory included) are each pushed as an OCI image of the
// repository "layers", tagged with the layer's ID, exactly as they are on
// the node's disk (internal/contentreg, gzip-compressed), and then the
// snapshot is recorded in the shared table (store.SharedSnapshot) with
// the manifest digest of every layer. Lists, lookups and deletes of
// snapshots answer from that table, so every node gives the same answer
// (a node's snapshots from before it had a registry stay its own, listed
// and found on it alone, their layers kept).
// A create from a snapshot whose layers are not on the node pulls them
// first (Fetch), parents first, each verified by its digest, into the
// backend's own layer directory under the same layer ID.
//
// # Guarantees
//
//   - A snapshot is visible (listed, found) only once every layer of it
//     is in the registry: a push that fails fails the snapshot, and the
//     Keeper deletes its layer.
//   - A pulled layer whose bytes are not those of its digest is refused
//     (contentreg.ErrDigestMismatch, with api.ErrUnavailable: a 503, as a
//     template's) and nothing of it is left on the node; the create fails.
//   - A snapshot's template the node does not have is pulled first
//     (sandbox.Fetcher: a template built on another node); one the
//     cluster does not have is a clear error naming it, before any layer
//     is pulled.
//   - Two creates of one snapshot at once on one node pull each layer
//     once.
//   - Checkpoints stay the node's (they are not shared).
//
// Deleting a snapshot drops its record; its images stay in the registry
// (a registry's garbage collection removes untagged content; the layers'
// tags are overwritten by nothing, since layer IDs are unique).
package snapreg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/timetravel"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Repo is the repository (under the registry's prefix) of every layer.
const Repo = "layers"

// Content moves directory trees through the registry; *contentreg.Registry
// implements it.
type Content interface {
	PushTree(ctx context.Context, repo, tag, dir string, meta []byte) (digest string, err error)
	PullTree(ctx context.Context, repo, digest, dir string) (meta []byte, err error)
}

// Mover is a backend whose layers move between nodes (the native and
// gvisor backends).
type Mover interface {
	// LayerSource returns the directory of layer id as it is on disk,
	// and its parent ("" for none).
	LayerSource(id string) (dir, parent string, err error)
	// LayerHere reports whether layer id is complete on this node.
	LayerHere(id string) bool
	// ImportLayer makes layer id (on parent, on the template at rootfs)
	// from what fill writes into a directory that does not exist yet.
	ImportLayer(ctx context.Context, id, parent, rootfs string, fill func(dir string) error) error
}

// Options configure a Store.
type Options struct {
	Store   *store.Store // required: its shared engine holds the records
	Content Content      // required
	// Movers are the backends' layers by backend name ("native",
	// "gvisor"); a layer goes to the mover whose Owns says so.
	Movers map[string]Mover // required: at least one
	// Owner names the backend of a layer ID (gvisor's start with "gv").
	Owner func(layer string) string // required
	// Templates resolve a snapshot's template to its root here.
	Templates sandbox.Templates // required
	// Node is this node's name, recorded with the snapshots it takes.
	Node   string
	Logger *slog.Logger
}

// Store is a timetravel.LayerStore whose snapshots are the cluster's.
// Checkpoints are the embedded node store's.
type Store struct {
	*store.Store
	content   Content
	movers    map[string]Mover
	owner     func(string) string
	templates sandbox.Templates
	node      string
	log       *slog.Logger

	mu sync.Mutex
	// +checklocks:mu
	pulling map[string]*sync.Mutex // by layer: one import of each at a time
}

var (
	_ timetravel.LayerStore      = (*Store)(nil)
	_ timetravel.SnapshotCounter = (*Store)(nil)
	_ timetravel.Fetcher         = (*Store)(nil)
)

// New returns a Store.
func New(o Options) (*Store, error) {
	if o.Store == nil || o.Content == nil || len(o.Movers) == 0 || o.Owner == nil || o.Templates == nil {
		return nil, errors.New("snapreg: Store, Content, Movers, Owner and Templates are required")
	}
	s := &Store{Store: o.Store, content: o.Content, movers: o.Movers, owner: o.Owner, templates: o.Templates,
		node: o.Node, log: o.Logger, pulling: map[string]*sync.Mutex{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s, nil
}

// layerMeta is the configuration blob of a layer's image.
type layerMeta struct {
	Layer   string `json:"layer"`
	Parent  string `json:"parent,omitempty"`
	Backend string `json:"backend"`
}

func (s *Store) mover(layer string) (string, Mover, error) {
	name := s.owner(layer)
	m, ok := s.movers[name]
	if !ok {
		return "", nil, fmt.Errorf("layer %s belongs to the %s backend, whose layers cannot move: %w", layer, name, api.ErrUnimplemented)
	}
	return name, m, nil
}

// PutSnapshot pushes the snapshot's layers to the registry, then records
// it in the shared table. A named snapshot replaces the team's snapshot
// of that name; the layer it replaced is returned.
func (s *Store) PutSnapshot(ctx context.Context, sn *store.Snapshot) (string, error) {
	backend, chain, err := s.push(ctx, sn.Layer)
	if err != nil {
		return "", fmt.Errorf("snapshot %s: %w", sn.ID, err)
	}
	shared := &store.SharedSnapshot{Snapshot: *sn, Backend: backend, Node: s.node, Digest: chain[0].Digest, Chain: chain}
	replaced, err := s.Store.PutSharedSnapshot(ctx, shared)
	if err != nil {
		return "", err
	}
	sn.ID, sn.Team = shared.ID, shared.Team
	s.log.InfoContext(ctx, "snapshot pushed to the registry", "snapshot", sn.ID, "layers", len(chain), "digest", shared.Digest)
	return replaced, nil
}

// push pushes layer and the layers below it, each as the image
// Repo:<layer ID>, and returns their backend and digests, top first.
func (s *Store) push(ctx context.Context, layer string) (string, []store.LayerRef, error) {
	backend, m, err := s.mover(layer)
	if err != nil {
		return "", nil, err
	}
	var chain []store.LayerRef
	for id := layer; id != ""; {
		dir, parent, err := m.LayerSource(id)
		if err != nil {
			return "", nil, err
		}
		meta, _ := json.Marshal(layerMeta{Layer: id, Parent: parent, Backend: backend})
		digest, err := s.content.PushTree(ctx, Repo, id, dir, meta)
		if err != nil {
			return "", nil, fmt.Errorf("pushing layer %s to the registry: %w", id, err)
		}
		chain = append(chain, store.LayerRef{Layer: id, Digest: digest})
		id = parent
	}
	return backend, chain, nil
}

// FindSnapshot returns the cluster's snapshot whose ID or name is ref,
// else one this node took before it had a registry (its own).
func (s *Store) FindSnapshot(ctx context.Context, ref string) (*store.Snapshot, error) {
	sn, err := s.Store.FindSharedSnapshot(ctx, ref)
	if errors.Is(err, api.ErrNotFound) {
		return s.Store.FindSnapshot(ctx, ref)
	}
	if err != nil {
		return nil, err
	}
	return &sn.Snapshot, nil
}

// ListSnapshots lists the cluster's snapshots and those this node took
// before it had a registry, newest first.
func (s *Store) ListSnapshots(ctx context.Context, sandboxID, name string) ([]*store.Snapshot, error) {
	list, err := s.Store.ListSharedSnapshots(ctx, sandboxID, name)
	if err != nil {
		return nil, err
	}
	own, err := s.Store.ListSnapshots(ctx, sandboxID, name)
	if err != nil {
		return nil, err
	}
	out := make([]*store.Snapshot, 0, len(list)+len(own))
	seen := map[string]bool{}
	for _, sn := range list {
		out = append(out, &sn.Snapshot)
		seen[sn.ID] = true
	}
	for _, sn := range own {
		if !seen[sn.ID] {
			out = append(out, sn)
		}
	}
	slices.SortStableFunc(out, func(a, b *store.Snapshot) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	return out, nil
}

// DeleteSnapshot deletes a snapshot's record for the cluster (or this
// node's own). Every node collects its copy of the layers once nothing
// keeps them.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	err := s.Store.DeleteSharedSnapshot(ctx, id)
	if errors.Is(err, api.ErrNotFound) {
		return s.Store.DeleteSnapshot(ctx, id)
	}
	return err
}

// SnapshotUsage counts the team's snapshots across the cluster, and this
// node's own.
func (s *Store) SnapshotUsage(ctx context.Context, team, except string) (tenancy.Kept, error) {
	k, err := s.Store.SharedSnapshotUsage(ctx, team, except)
	if err != nil {
		return k, err
	}
	own, err := s.Store.SnapshotUsage(ctx, team, except)
	k.Count, k.Bytes = k.Count+own.Count, k.Bytes+own.Bytes
	return k, err
}

// Fetch makes sure every layer of snapshot sn is on this node, pulling the
// missing ones (parents first) from the registry. This node's own
// snapshots are here already.
func (s *Store) Fetch(ctx context.Context, sn *store.Snapshot) error {
	shared, err := s.Store.FindSharedSnapshot(tenancy.NewContext(ctx, tenancy.Principal{}), sn.ID)
	if errors.Is(err, api.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := s.fetch(ctx, shared.Chain, shared.Template); err != nil {
		return fmt.Errorf("snapshot %s: %w", snapshotRef(shared), err)
	}
	return nil
}

// fetch pulls the layers of chain (top first) this node lacks, parents
// first, onto the template's root here.
func (s *Store) fetch(ctx context.Context, chain []store.LayerRef, template string) error {
	if len(chain) == 0 {
		return fmt.Errorf("no layers: %w", api.ErrNotFound)
	}
	_, m, err := s.mover(chain[0].Layer)
	if err != nil {
		return err
	}
	if m.LayerHere(chain[0].Layer) {
		return nil
	}
	if f, ok := s.templates.(sandbox.Fetcher); ok {
		// A template built on another node is pulled first.
		if err := f.Fetch(ctx, template); err != nil {
			return fmt.Errorf("its template %q: %w", template, err)
		}
	}
	rootfs, err := s.templates.Resolve(template)
	if err != nil {
		return fmt.Errorf("its template %q is not on this node: %w", template, errors.Join(err, api.ErrNotFound))
	}
	up := slices.Clone(chain)
	slices.Reverse(up) // parents first
	for i, l := range up {
		parent := ""
		if i > 0 {
			parent = up[i-1].Layer
		}
		if err := s.pull(ctx, m, l, parent, rootfs); err != nil {
			return err
		}
	}
	s.log.InfoContext(ctx, "layers pulled from the registry", "layer", chain[0].Layer, "layers", len(chain))
	return nil
}

// pull imports one layer, once at a time per layer.
func (s *Store) pull(ctx context.Context, m Mover, l store.LayerRef, parent, rootfs string) error {
	s.mu.Lock()
	mu, ok := s.pulling[l.Layer]
	if !ok {
		mu = new(sync.Mutex)
		s.pulling[l.Layer] = mu
	}
	s.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if m.LayerHere(l.Layer) {
		return nil
	}
	return m.ImportLayer(ctx, l.Layer, parent, rootfs, func(dir string) error {
		raw, err := s.content.PullTree(ctx, Repo, l.Digest, dir)
		if err != nil {
			return fmt.Errorf("pulling layer %s (%s) from the cluster's content registry: %w: %w", l.Layer, l.Digest, err, api.ErrUnavailable)
		}
		var meta layerMeta
		if err := json.Unmarshal(raw, &meta); err != nil || meta.Layer != l.Layer || meta.Parent != parent {
			return fmt.Errorf("pulled layer %s (%s) describes itself as %q on %q: %w", l.Layer, l.Digest, meta.Layer, meta.Parent, api.ErrUnavailable)
		}
		return nil
	})
}

func snapshotRef(sn *store.SharedSnapshot) string {
	if sn.Name != "" {
		return sn.Name
	}
	return sn.ID
}

// OwnerByPrefix is an Options.Owner: layers whose ID starts with prefix
// are backend's, the others dflt's.
func OwnerByPrefix(prefix, backend, dflt string) func(string) string {
	return func(layer string) string {
		if strings.HasPrefix(layer, prefix) {
			return backend
		}
		return dflt
	}
}
