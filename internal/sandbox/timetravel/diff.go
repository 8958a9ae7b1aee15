package timetravel

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox"
)

// FileDiff is one path that differs between two states of a sandbox.
type FileDiff struct {
	Path   string `json:"path"`
	Change string `json:"change"` // added, changed, removed
	Kind   string `json:"kind"`   // file, dir, symlink, other (removed: what it was, if known)
	Size   int64  `json:"size,omitempty"`
	Mode   uint32 `json:"mode,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	Target string `json:"target,omitempty"`
	// OldSize and OldSHA256 are the file's before, when it changed.
	OldSize   int64  `json:"oldSize,omitempty"`
	OldSHA256 string `json:"oldSha256,omitempty"`
}

// Diff lists what differs between two states of a live sandbox: from
// ("" or "create": as it was created) and to ("" or "now": as it is; a
// running sandbox's files are hashed for it), each else a checkpoint's ID
// or name.
func (k *Keeper) Diff(ctx context.Context, id, from, to string) ([]FileDiff, error) {
	ls, err := k.layerStore()
	if err != nil {
		return nil, err
	}
	l, err := k.core.Live(id)
	if err != nil {
		return nil, err
	}
	// The layers (and live sandbox) each side reads are found, and
	// pinned, under the layer lock; their files are read after it is
	// released (they cost what they weigh), so that nothing waits for
	// them but this request.
	k.lock.RLock()
	a, err := k.diffSide(ctx, ls, l, from, true)
	var b diffSide
	if err == nil {
		b, err = k.diffSide(ctx, ls, l, to, false)
	}
	pins := []string{a.layer, b.layer, a.base, b.base}
	if err == nil {
		k.lock.Pin(pins...)
	}
	k.lock.RUnlock()
	if err != nil {
		return nil, err
	}
	defer k.lock.Unpin(pins...)
	ca, err := a.changes(ctx, k.layers)
	if err != nil {
		return nil, err
	}
	cb, err := b.changes(ctx, k.layers)
	if err != nil {
		return nil, err
	}
	return diff(ca, cb), nil
}

// diffSide is one side of a diff: a layer's changes, a live sandbox's
// (on its boot layer base), or nothing (as created from the template).
type diffSide struct {
	layer string
	live  isolation.Checkpointer
	base  string
}

// diffSide resolves ref ("" or "create" on the from side: as created;
// "" or "now": as the sandbox is; else a checkpoint's ID or name) for
// l. The caller holds the layer lock for reading.
func (k *Keeper) diffSide(ctx context.Context, ls LayerStore, l *sandbox.Live, ref string, isFrom bool) (diffSide, error) {
	created, base, cold := l.Layers()
	switch {
	case ref == "create" || (ref == "" && isFrom):
		return diffSide{layer: created}, nil
	case ref == "now" || ref == "":
		if cold != "" {
			return diffSide{layer: cold}, nil
		}
		cp, ok := isolation.As[isolation.Checkpointer](l.Box())
		if !ok {
			return diffSide{}, fmt.Errorf("the %s backend cannot list changes: %w", k.core.Backend(), api.ErrUnimplemented)
		}
		return diffSide{live: cp, base: base}, nil
	}
	c, err := k.findCheckpoint(ctx, ls, l.ID(), ref)
	if err != nil {
		return diffSide{}, err
	}
	return diffSide{layer: c.Layer}, nil
}

// changes lists the side's changes against the template, reading (and
// hashing) files: it is called without the layer lock, the side's
// layers pinned.
func (d diffSide) changes(ctx context.Context, l isolation.Layers) ([]isolation.FileChange, error) {
	switch {
	case d.live != nil:
		return d.live.Changes(ctx)
	case d.layer != "":
		return l.LayerChanges(ctx, d.layer)
	}
	return nil, nil
}

// diff compares two lists of changes against the same template.
func diff(from, to []isolation.FileChange) []FileDiff {
	fm := map[string]isolation.FileChange{}
	for _, c := range from {
		fm[c.Path] = c
	}
	var out []FileDiff
	seen := map[string]bool{}
	for _, t := range to {
		seen[t.Path] = true
		f, ok := fm[t.Path]
		d := FileDiff{Path: t.Path, Kind: t.Kind, Size: t.Size, Mode: t.Mode, SHA256: t.SHA256, Target: t.Target}
		switch {
		case ok && f.Kind == t.Kind && f.SHA256 == t.SHA256 && f.Size == t.Size && f.Mode == t.Mode && f.Target == t.Target && f.Opaque == t.Opaque:
			continue
		case t.Kind == "removed":
			if ok && f.Kind == "removed" {
				continue
			}
			d.Kind, d.Size, d.Mode = "", 0, 0
			if ok {
				d.Kind, d.OldSize, d.OldSHA256 = f.Kind, f.Size, f.SHA256
			}
			d.Change = "removed"
		case ok && f.Kind != "removed":
			d.Change, d.OldSize, d.OldSHA256 = "changed", f.Size, f.SHA256
		case !ok && t.InTemplate:
			d.Change = "changed"
		default:
			d.Change = "added"
		}
		out = append(out, d)
	}
	for _, f := range from {
		if seen[f.Path] {
			continue
		}
		// At "to" the path is as the template has it.
		d := FileDiff{Path: f.Path, Kind: f.Kind}
		switch {
		case f.Kind == "removed":
			d.Change, d.Kind = "added", ""
		case f.InTemplate:
			d.Change, d.OldSize, d.OldSHA256 = "changed", f.Size, f.SHA256
		default:
			d.Change, d.OldSize, d.OldSHA256 = "removed", f.Size, f.SHA256
		}
		out = append(out, d)
	}
	sortDiff(out)
	return out
}

func sortDiff(d []FileDiff) {
	slices.SortFunc(d, func(a, b FileDiff) int { return strings.Compare(a.Path, b.Path) })
}
