package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation"
)

// layerMeta is a layer's meta.json.
type layerMeta struct {
	ID      string                 `json:"id"`
	Parent  string                 `json:"parent,omitempty"`
	Depth   int                    `json:"depth"`
	Bytes   int64                  `json:"bytes"`
	Created time.Time              `json:"created"`
	RootFS  string                 `json:"rootfs"` // the template it sits on
	Entries []isolation.FileChange `json:"entries"`
	// Snapshot marks a layer of the btrfs store (layerfs.go): its tree is
	// a read-only snapshot, and its entries are listed when first needed
	// (entries.json), with Gen (the files fence wrote at create, by path,
	// with their mtime then) left out as Checkpointer.Changes does.
	Snapshot bool                     `json:"snapshot,omitempty"`
	Gen      map[string]unix.Timespec `json:"gen,omitempty"`

	// listMu serialises the listing of a snapshot's entries; listed is
	// set (under the backend's layers.mu, with Entries) once done.
	listMu sync.Mutex
	listed bool
}

func (m *layerMeta) info() isolation.LayerInfo {
	return isolation.LayerInfo{ID: m.ID, Parent: m.Parent, Depth: m.Depth, Bytes: m.Bytes, Files: len(m.Entries), Created: m.Created}
}

// layerCache holds the metas of the backend's layers, read once.
type layerCache struct {
	mu sync.Mutex
	// +checklocks:mu
	loaded bool
	// +checklocks:mu
	metas map[string]*layerMeta
	// +checklocks:mu
	making int64 // bytes reserved by layers being made
	// snapping holds the layers whose snapshot exists before their
	// meta.json (the btrfs store): Cleanup leaves them alone.
	// +checklocks:mu
	snapping map[string]bool
}

func (b *Backend) layersDir() string {
	return filepath.Join(b.opts.StateDir, "layers", b.opts.Instance)
}

// layerTree is where layer id's files are: its tree/, or its snapshot's
// upper dir in the btrfs store.
func (b *Backend) layerTree(id string) string {
	if b.lfs != nil {
		if m, err := b.layerMeta(id); err == nil && m.Snapshot {
			return b.lfs.snapshotTree(id)
		}
	}
	return filepath.Join(b.layersDir(), id, "tree")
}

func (b *Backend) layerBudget() int64 {
	if b.opts.LayerBudget > 0 {
		return b.opts.LayerBudget
	}
	return defaultLayerBudget
}

// layersUsedLocked is how many bytes the layers take: every complete
// layer's (their metas loaded first), and what the layers being made
// reserved.
//
// +checklocks:b.layers.mu
func (b *Backend) layersUsedLocked() (int64, error) {
	if err := b.loadLayersLocked(); err != nil {
		return 0, err
	}
	used := b.layers.making
	for _, m := range b.layers.metas {
		used += m.Bytes
	}
	return used, nil
}

// loadLayersLocked reads every complete layer's meta once.
//
// +checklocks:b.layers.mu
func (b *Backend) loadLayersLocked() error {
	if b.layers.loaded {
		return nil
	}
	metas := map[string]*layerMeta{}
	ents, err := os.ReadDir(b.layersDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("listing layers: %w", err)
	}
	for _, e := range ents {
		if !idPattern.MatchString(e.Name()) {
			continue
		}
		m, err := readLayerMeta(filepath.Join(b.layersDir(), e.Name(), "meta.json"))
		if err != nil || m.ID != e.Name() {
			b.log.Warn("ignoring a layer without a readable meta.json", "layer", e.Name(), "err", err)
			continue
		}
		metas[m.ID] = m
	}
	b.layers.metas, b.layers.loaded = metas, true
	return nil
}

func readLayerMeta(path string) (*layerMeta, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var m layerMeta
	if err := json.NewDecoder(io.LimitReader(f, 256<<20)).Decode(&m); err != nil {
		return nil, err
	}
	return &m, nil
}

func (b *Backend) layerMeta(id string) (*layerMeta, error) {
	b.layers.mu.Lock()
	defer b.layers.mu.Unlock()
	if err := b.loadLayersLocked(); err != nil {
		return nil, err
	}
	m, ok := b.layers.metas[id]
	if !ok {
		return nil, fmt.Errorf("layer %s: %w", id, isolation.ErrNotFound)
	}
	return m, nil
}

// layerChain returns layer and its parents, top first.
func (b *Backend) layerChain(id string) ([]string, error) {
	var chain []string
	for id != "" {
		if len(chain) >= maxLayerStack {
			return nil, fmt.Errorf("layer %s sits on more than %d layers: %w", chain[0], maxLayerStack, isolation.ErrLayerBudget)
		}
		m, err := b.layerMeta(id)
		if err != nil {
			return nil, err
		}
		chain = append(chain, id)
		id = m.Parent
	}
	return chain, nil
}

// ListLayers implements isolation.Layers.
func (b *Backend) ListLayers(ctx context.Context) ([]isolation.LayerInfo, error) {
	b.layers.mu.Lock()
	defer b.layers.mu.Unlock()
	if err := b.loadLayersLocked(); err != nil {
		return nil, err
	}
	out := make([]isolation.LayerInfo, 0, len(b.layers.metas))
	for _, m := range b.layers.metas {
		out = append(out, m.info())
	}
	slices.SortFunc(out, func(a, c isolation.LayerInfo) int { return a.Created.Compare(c.Created) })
	return out, nil
}

// DeleteLayer implements isolation.Layers.
func (b *Backend) DeleteLayer(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("invalid layer id %q", id)
	}
	// A sandbox's overlay looks names up in its layers as it goes: the
	// files of a layer under a live sandbox must stay.
	b.mu.Lock()
	for sid, sb := range b.live {
		if slices.Contains(sb.chain, id) {
			b.mu.Unlock()
			return fmt.Errorf("layer %s is used by sandbox %s: %w", id, sid, isolation.ErrLayerInUse)
		}
	}
	b.mu.Unlock()
	b.layers.mu.Lock()
	if err := b.loadLayersLocked(); err != nil {
		b.layers.mu.Unlock()
		return err
	}
	delete(b.layers.metas, id)
	b.layers.mu.Unlock()
	// Renamed away first: a half-removed layer never looks complete (and
	// a snapshot without its layer is Cleanup's to delete).
	dir := filepath.Join(b.layersDir(), id)
	trash := filepath.Join(b.layersDir(), layerTmpPrefix+"del-"+id)
	if err := os.Rename(dir, trash); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing layer %s: %w", id, err)
	}
	if b.lfs != nil {
		if err := b.lfs.removeSnapshot(id); err != nil {
			return fmt.Errorf("removing layer %s: %w", id, err)
		}
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("removing layer %s: %w", id, err)
	}
	return nil
}

// cleanupLayers removes what a crash left of layers being made or deleted,
// once the squashes in progress are done (their layers are being made).
func (b *Backend) cleanupLayers() error {
	b.squashes.Wait()
	ents, err := os.ReadDir(b.layersDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing layers: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), layerTmpPrefix) {
			errs = append(errs, os.RemoveAll(filepath.Join(b.layersDir(), e.Name())))
		}
	}
	return errors.Join(errs...)
}
