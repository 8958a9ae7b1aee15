package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fencesandbox/fence/internal/isolation"
)

// Layers that move between nodes (internal/snapreg): a layer's directory
// (layer.json and image/: the checkpoint image, memory included for a
// full checkpoint) is packed as it is on disk, and unpacked on another
// node into a ".tmp-" directory of its layers, which ImportLayer checks
// and renames into place under the same ID. A crash mid-import leaves a
// ".tmp-" directory, which Cleanup removes.

// LayerSource returns the directory holding layer id as it is on disk,
// to be packed as it is, and its parent: always "" (an image is whole).
func (b *Backend) LayerSource(id string) (dir, parent string, err error) {
	if _, err := b.readLayer(id); err != nil {
		return "", "", err
	}
	return b.layerDir(id), "", nil
}

// LayerHere reports whether layer id is complete on this node.
func (b *Backend) LayerHere(id string) bool { return b.HasLayer(id) }

// ImportLayer makes layer id of this node from what fill writes into a
// directory that does not exist yet (layer.json and image/, as
// LayerSource gave them on another node), taken on the template at rootfs
// here (a restore checks it). parent must be "". A layer already here is
// kept and fill not called. On an error nothing of the layer is left.
func (b *Backend) ImportLayer(ctx context.Context, id, parent, rootfs string, fill func(dir string) error) error {
	if err := validLayerID(id); err != nil {
		return err
	}
	if parent != "" {
		return fmt.Errorf("layer %s: a gvisor layer has no parent, not %q", id, parent)
	}
	if b.HasLayer(id) {
		return nil
	}
	if err := b.layerBudget(ctx); err != nil {
		return err
	}
	tmp := filepath.Join(b.lyDir, layerTmpPrefix+"in-"+id)
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
	raw, err := os.ReadFile(filepath.Join(tmp, "layer.json"))
	if err != nil {
		return fmt.Errorf("importing layer %s: %w", id, err)
	}
	var m layerMeta
	if err := json.Unmarshal(raw, &m); err != nil || m.ID != id {
		return fmt.Errorf("importing layer %s: its layer.json names %q: %w", id, m.ID, isolation.ErrNotFound)
	}
	if fi, err := os.Lstat(filepath.Join(tmp, "image")); err != nil || !fi.IsDir() {
		return fmt.Errorf("importing layer %s: no image directory", id)
	}
	m.RootFS = rootfs
	if err := os.Remove(filepath.Join(tmp, "layer.json")); err != nil {
		return fmt.Errorf("importing layer %s: %w", id, err)
	}
	if err := writeJSON(filepath.Join(tmp, "layer.json"), m); err != nil {
		return fmt.Errorf("importing layer %s: %w", id, err)
	}
	if err := os.Rename(tmp, b.layerDir(id)); err != nil {
		return fmt.Errorf("importing layer %s: %w", id, err)
	}
	ok = true
	return nil
}

// LayerPrefix starts every gvisor layer's ID (and no native one's).
const LayerPrefix = layerPrefix
