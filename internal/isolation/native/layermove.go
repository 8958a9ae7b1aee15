package native

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fencesandbox/fence/internal/isolation"
)

// Layers that move between nodes (internal/snapreg): a copied layer's
// directory (meta.json and tree/, the files owned by ids relative to the
// sandbox's range) is packed as it is on disk, and unpacked on another
// node into a ".tmp-" directory of its layers, which ImportLayer checks
// and renames into place under the same ID. A crash mid-import leaves a
// ".tmp-" directory, which Cleanup removes.

// LayerSource returns the directory holding layer id as it is on disk
// (meta.json and tree/), to be packed as it is, and its parent ("" when
// it sits on the template). Layers of the btrfs store (whose tree is a
// snapshot elsewhere) cannot move.
func (b *Backend) LayerSource(id string) (dir, parent string, err error) {
	m, err := b.layerMeta(id)
	if err != nil {
		return "", "", err
	}
	if m.Snapshot {
		return "", "", fmt.Errorf("layer %s is a btrfs snapshot, which cannot move to another node: %w", id, isolation.ErrUnsupported)
	}
	return filepath.Join(b.layersDir(), id), m.Parent, nil
}

// LayerHere reports whether layer id is complete on this node (not
// isolation.LayerOwner: the multi backend sends native every layer gvisor
// does not own).
func (b *Backend) LayerHere(id string) bool {
	_, err := b.layerMeta(id)
	return err == nil
}

// ImportLayer makes layer id of this node from what fill writes into a
// directory that does not exist yet (its meta.json and tree/, as
// LayerSource gave them on another node), taken on the template at rootfs
// here. The layer must name id and parent as its own and its parent (the
// parent already here). A layer already here is kept and fill not called.
// On an error nothing of the layer is left.
func (b *Backend) ImportLayer(ctx context.Context, id, parent, rootfs string, fill func(dir string) error) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("invalid layer id %q", id)
	}
	if b.LayerHere(id) {
		return nil
	}
	if parent != "" && !b.LayerHere(parent) {
		return fmt.Errorf("layer %s: its parent %s is not here: %w", id, parent, isolation.ErrNotFound)
	}
	if err := os.MkdirAll(b.layersDir(), 0o700); err != nil {
		return fmt.Errorf("creating layers directory: %w", err)
	}
	tmp := filepath.Join(b.layersDir(), layerTmpPrefix+"in-"+id)
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("importing layer %s: %w", id, err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	if err := fill(tmp); err != nil {
		return fmt.Errorf("importing layer %s: %w", id, err)
	}
	metaPath := filepath.Join(tmp, "meta.json")
	m, err := readLayerMeta(metaPath)
	if err != nil {
		return fmt.Errorf("importing layer %s: reading its meta.json: %w", id, err)
	}
	if m.ID != id || m.Parent != parent || m.Snapshot {
		return fmt.Errorf("importing layer %s: its meta.json names layer %q on %q, want %q on %q", id, m.ID, m.Parent, id, parent)
	}
	if fi, err := os.Lstat(filepath.Join(tmp, "tree")); err != nil || !fi.IsDir() {
		return fmt.Errorf("importing layer %s: no tree directory: %w", id, errors.Join(err, isolation.ErrNotFound))
	}
	b.layers.mu.Lock()
	used, err := b.layersUsedLocked()
	b.layers.mu.Unlock()
	if err != nil {
		return err
	}
	if used+m.Bytes > b.layerBudget() {
		return fmt.Errorf("layers take %d bytes, the budget is %d: %w", used, b.layerBudget(), isolation.ErrLayerBudget)
	}
	m.RootFS = rootfs
	if err := os.Remove(metaPath); err != nil {
		return fmt.Errorf("importing layer %s: %w", id, err)
	}
	if err := b.commitLayer(tmp, m); err != nil {
		return err
	}
	ok = true
	return nil
}
