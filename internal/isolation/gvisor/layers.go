package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
)

// Layers on gVisor are checkpoint images: memory, processes, open files
// and the root overlay's contents of a sandbox at one moment, taken with
// `runsc checkpoint --leave-running` (the sandbox is stopped while the
// image is written and runs on after it). A sandbox booted on a layer is
// `runsc restore` of its image under the new sandbox's ID, in a fresh
// directory, cgroup, network namespace and network stack: its processes
// go on from where the source's were. An image is self-contained (no
// parent) and only read by a restore, so one layer boots any number of
// sandboxes, and a restore holds nothing of it once it returns (runsc
// loads the whole image before it returns): a layer can be deleted while
// sandboxes booted on it run.
//
// A layer lives in DIR/layers/<instance>/<id>/ (layer.json and image/);
// it is made in a ".tmp-" directory renamed into place once complete, so
// a crash never leaves a partial layer that looks complete, and Cleanup
// removes the partial ones.

// DefaultLayerBytes is the layers' disk budget when Options.LayerBytes is
// zero.
const DefaultLayerBytes = 32 << 30

// layerTmpPrefix marks a layer being made (or deleted).
const layerTmpPrefix = ".tmp-"

// layerPrefix starts every gvisor layer's ID, so that a router of several
// backends (and a reader of the store) can tell them from native's.
const layerPrefix = "gv"

// layerMeta is a layer's layer.json: what a restore of its image needs.
type layerMeta struct {
	ID      string        `json:"id"`
	Kind    string        `json:"kind"` // layerMemory or layerFiles
	Source  string        `json:"source"`
	RootFS  string        `json:"rootfs"`
	Bytes   int64         `json:"bytes"`
	Created time.Time     `json:"created"`
	Took    time.Duration `json:"took"`
}

// Layer kinds.
const (
	// layerMemory is a full checkpoint (runsc checkpoint): a sandbox booted
	// on it goes on where the source was.
	layerMemory = "memory"
	// layerFiles is a filesystem checkpoint (runsc fscheckpoint): a
	// sandbox booted on it starts anew on the source's files.
	layerFiles = "files"
)

func (m layerMeta) info() isolation.LayerInfo {
	return isolation.LayerInfo{ID: m.ID, Depth: 1, Bytes: m.Bytes, Created: m.Created, Took: m.Took, Memory: m.Kind == layerMemory}
}

var (
	_ isolation.Layers       = (*Backend)(nil)
	_ isolation.LayerOwner   = (*Backend)(nil)
	_ isolation.Checkpointer = (*sandbox)(nil)
)

func (b *Backend) layerDir(id string) string { return filepath.Join(b.lyDir, id) }

func validLayerID(id string) error {
	if !strings.HasPrefix(id, layerPrefix) || !idPattern.MatchString(id) {
		return fmt.Errorf("invalid layer id %q: %w", id, isolation.ErrNotFound)
	}
	return nil
}

// readLayer returns layer id's metadata; an unknown or incomplete layer
// is an error wrapping isolation.ErrNotFound.
func (b *Backend) readLayer(id string) (layerMeta, error) {
	if err := validLayerID(id); err != nil {
		return layerMeta{}, err
	}
	raw, err := os.ReadFile(filepath.Join(b.layerDir(id), "layer.json"))
	if err != nil {
		return layerMeta{}, fmt.Errorf("layer %s: %w", id, errors.Join(err, isolation.ErrNotFound))
	}
	var m layerMeta
	if err := json.Unmarshal(raw, &m); err != nil || m.ID != id {
		return layerMeta{}, fmt.Errorf("layer %s: bad layer.json: %w", id, isolation.ErrNotFound)
	}
	return m, nil
}

// HasLayer implements isolation.LayerOwner.
func (b *Backend) HasLayer(id string) bool {
	_, err := b.readLayer(id)
	return err == nil
}

// Checkpoint implements isolation.Checkpointer: it writes the running
// sandbox's checkpoint image (memory and processes included) into a new
// layer with `runsc checkpoint --leave-running`; the sandbox is stopped
// while the image is written and runs on after it. A failed checkpoint
// leaves no layer.
func (s *sandbox) Checkpoint(ctx context.Context) (isolation.LayerInfo, error) {
	return s.makeLayer(ctx, layerMemory)
}

// CheckpointFiles implements isolation.FileCheckpointer: the sandbox's
// filesystem alone (its root overlay's contents), written with `runsc
// fscheckpoint --leave-running`; a sandbox booted on it starts anew.
func (s *sandbox) CheckpointFiles(ctx context.Context) (isolation.LayerInfo, error) {
	return s.makeLayer(ctx, layerFiles)
}

func (s *sandbox) makeLayer(ctx context.Context, kind string) (isolation.LayerInfo, error) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if err := s.liveLocked(); err != nil {
		return isolation.LayerInfo{}, err
	}
	if s.paused.Load() {
		return isolation.LayerInfo{}, fmt.Errorf("checkpointing sandbox %s: %w", s.id, isolation.ErrPaused)
	}
	if err := s.b.layerBudget(ctx); err != nil {
		return isolation.LayerInfo{}, err
	}
	ctx = context.WithoutCancel(ctx)
	m := layerMeta{ID: layerPrefix + isolation.NewID(), Kind: kind, Source: s.id, RootFS: s.rec.RootFS}
	tmp := filepath.Join(s.b.lyDir, layerTmpPrefix+m.ID)
	s.b.mu.Lock()
	s.b.making[m.ID] = true
	s.b.mu.Unlock()
	defer func() {
		s.b.mu.Lock()
		delete(s.b.making, m.ID)
		s.b.mu.Unlock()
	}()
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return isolation.LayerInfo{}, fmt.Errorf("creating layer directory: %w", err)
	}
	t0 := time.Now()
	var err error
	if kind == layerMemory {
		err = s.checkpointLocked(ctx, filepath.Join(tmp, "image"), true)
	} else {
		err = s.fsCheckpointLocked(ctx, filepath.Join(tmp, "image"))
	}
	m.Took = time.Since(t0)
	if err == nil {
		m.Bytes, m.Created = treeBytes(tmp), time.Now().UTC()
		err = writeJSON(filepath.Join(tmp, "layer.json"), m)
	}
	if err == nil {
		// Complete only once renamed into place.
		err = os.Rename(tmp, s.b.layerDir(m.ID))
	}
	if err != nil {
		os.RemoveAll(tmp)
		return isolation.LayerInfo{}, fmt.Errorf("checkpointing sandbox %s: %w", s.id, err)
	}
	return m.info(), nil
}

// fsCheckpointLocked writes the sandbox's filesystem checkpoint to dir,
// which must not exist yet; the sandbox runs on.
//
// +checklocks:s.pmu
func (s *sandbox) fsCheckpointLocked(ctx context.Context, dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("creating checkpoint directory: %w", err)
	}
	return s.b.run(ctx, nil, "fscheckpoint", "--leave-running", "--image-path", dir, s.id)
}

// layerBudget fails with isolation.ErrLayerBudget when the layers take
// the backend's budget already.
func (b *Backend) layerBudget(ctx context.Context) error {
	limit := b.opts.LayerBytes
	if limit <= 0 {
		limit = DefaultLayerBytes
	}
	all, err := b.ListLayers(ctx)
	if err != nil {
		return err
	}
	var used int64
	for _, l := range all {
		used += l.Bytes
	}
	if used >= limit {
		return fmt.Errorf("gvisor layers take %d MiB of %d MiB: %w", used>>20, limit>>20, isolation.ErrLayerBudget)
	}
	return nil
}

// Changes implements isolation.Checkpointer: gVisor keeps a sandbox's
// writable layer in its own overlay file, which the host cannot read, so
// listing changed files is not supported.
func (s *sandbox) Changes(ctx context.Context) ([]isolation.FileChange, error) {
	return nil, errNoChanges
}

var errNoChanges = fmt.Errorf("listing changed files is not supported on the gvisor backend (the writable layer is gVisor's overlay file): %w", isolation.ErrUnsupported)

// Base implements isolation.Checkpointer.
func (s *sandbox) Base() string { return s.base }

// CreateOn implements isolation.Layers: the sandbox is a restore of the
// layer's image under spec.ID. spec.RootFS must be the template the layer
// was taken on. A memory layer's sandbox goes on with the source's
// processes; its agent is handed spec.Agent once restored (the
// environment, user and working directory of the commands it starts from
// then on), as a booted one is.
func (b *Backend) CreateOn(ctx context.Context, spec isolation.Spec, layer string) (isolation.Sandbox, error) {
	if layer == "" {
		return b.Create(ctx, spec)
	}
	m, err := b.readLayer(layer)
	if err != nil {
		return nil, err
	}
	if filepath.Clean(spec.RootFS) != filepath.Clean(m.RootFS) {
		return nil, fmt.Errorf("layer %s was taken on template root %s, not %s", layer, m.RootFS, spec.RootFS)
	}
	return b.create(ctx, spec, m)
}

// LayerChanges implements isolation.Layers: not supported (see Changes).
func (b *Backend) LayerChanges(ctx context.Context, layer string) ([]isolation.FileChange, error) {
	if _, err := b.readLayer(layer); err != nil {
		return nil, err
	}
	return nil, errNoChanges
}

// ListLayers implements isolation.Layers.
func (b *Backend) ListLayers(ctx context.Context) ([]isolation.LayerInfo, error) {
	ents, err := os.ReadDir(b.lyDir)
	if err != nil {
		return nil, fmt.Errorf("listing layers: %w", err)
	}
	var out []isolation.LayerInfo
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), layerTmpPrefix) {
			continue
		}
		if m, err := b.readLayer(e.Name()); err == nil {
			out = append(out, m.info())
		}
	}
	slices.SortFunc(out, func(a, c isolation.LayerInfo) int { return a.Created.Compare(c.Created) })
	return out, nil
}

// DeleteLayer implements isolation.Layers. A restore keeps nothing of its
// layer, so a layer is never in use.
func (b *Backend) DeleteLayer(ctx context.Context, id string) error {
	if err := validLayerID(id); err != nil {
		return fmt.Errorf("deleting layer: %w", err)
	}
	// Renamed away first: a half-removed layer never looks complete.
	trash := filepath.Join(b.lyDir, layerTmpPrefix+"del-"+id)
	if err := os.Rename(b.layerDir(id), trash); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("deleting layer %s: %w", id, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("deleting layer %s: %w", id, err)
	}
	return nil
}

// removePartialLayers removes the layers a crash interrupted while they
// were made or deleted (not those this process is making).
func (b *Backend) removePartialLayers() error {
	ents, _ := os.ReadDir(b.lyDir)
	var errs []error
	for _, e := range ents {
		b.mu.Lock()
		making := b.making[strings.TrimPrefix(e.Name(), layerTmpPrefix)]
		b.mu.Unlock()
		if strings.HasPrefix(e.Name(), layerTmpPrefix) && !making {
			if err := os.RemoveAll(filepath.Join(b.lyDir, e.Name())); err != nil {
				errs = append(errs, fmt.Errorf("removing partial layer: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// treeBytes is the disk space the regular files under dir take: their
// allocated blocks (a sparse file counts what it holds, not its size).
func treeBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if st, err := d.Info(); err == nil {
				n += allocated(st)
			}
		}
		return nil
	})
	return n
}

// allocated is the disk a file takes, its size where the system does
// not tell.
func allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
