package tbuild

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"

	"github.com/fencesandbox/fence/internal/tbuild/content"
)

// cached looks key up in the layer cache and pins its tree for the build
// buildID.
func (s *Service) cached(buildID, key string) (layer, bool) {
	e, ok := s.content.Cached(buildID, key)
	if !ok {
		return layer{}, false
	}
	var c buildCtx
	if json.Unmarshal(e.Ctx, &c) != nil {
		return layer{}, false
	}
	s.mu.Lock()
	s.recordLayerLocked(buildID, e.Tree)
	s.mu.Unlock()
	return layer{Tree: e.Tree, Ctx: c}, true
}

// keep records a cache entry.
func (s *Service) keep(key string, l layer) error {
	c, err := json.Marshal(l.Ctx)
	if err != nil {
		return err
	}
	return s.content.Keep(key, content.Entry{Tree: l.Tree, Ctx: c})
}

// pinLocked keeps tree for the build in progress buildID: pinned in the
// content store and named in its record.
// +checklocks:s.mu
func (s *Service) pinLocked(buildID, tree string) {
	s.content.Pin(buildID, tree)
	s.recordLayerLocked(buildID, tree)
}

func (s *Service) pin(buildID, tree string) {
	s.mu.Lock()
	s.pinLocked(buildID, tree)
	s.mu.Unlock()
}

// recordLayerLocked names tree among the layers of build buildID's
// record (a fence template's tree, an absolute path, is not one).
// +checklocks:s.mu
func (s *Service) recordLayerLocked(buildID, tree string) {
	if tree == "" || filepath.IsAbs(tree) {
		return
	}
	if rec := s.builds[buildID]; rec != nil && !slices.Contains(rec.Layers, tree) {
		rec.Layers = append(rec.Layers, tree)
	}
}

// saveLayers records the trees build buildID went through so far, so that
// a crash keeps the steps it finished cached.
func (s *Service) saveLayers(ctx context.Context, buildID string) {
	s.mu.Lock()
	rec := s.builds[buildID]
	s.mu.Unlock()
	if rec != nil {
		s.saveBuild(ctx, rec)
	}
}

// treesOf returns the trees a build record names.
func treesOf(b *Build) []string {
	out := slices.Clone(b.Layers)
	if b.Tree != "" {
		out = append(out, b.Tree)
	}
	return out
}
