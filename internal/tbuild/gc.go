package tbuild

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Layer trees are collected by mark and sweep, at start and after every
// template deletion. A tree is kept while something may still use it:
//
//   - a build record names it (the result of a ready build, or a layer any
//     build, ready or failed, went through: its chain stays cached);
//   - a build in progress uses it (pinned, under the service's lock, before
//     the tree is renamed into place or handed out by the cache);
//   - a sandbox create resolved it in the last leaseTime and creates are
//     in flight (past their capacity check, not recorded yet), so the
//     create may not be recorded yet;
//   - a deleted template's tombstone names it and a live sandbox (running
//     or paused) still names that template.
//
// Everything else under trees/ is swept, and the cache entries naming a
// swept tree go first. Crash safety: a deletion writes its tombstone
// (whole, renamed into place) before it removes the records; a cache entry
// is removed before its tree; a tree is renamed to .tmp-gc-* before it is
// removed, and .tmp-* leftovers are removed at start. A crash at any point
// leaves at worst garbage the next collection removes, never a record or
// cache entry naming a missing tree as usable (a cache entry whose tree is
// gone is a miss).

// leaseTime is how long a tree a sandbox create resolved is kept without
// a record naming it while creates are in flight.
const leaseTime = 10 * time.Minute

// tombstone is a deleted template whose trees wait for its last sandbox.
type tombstone struct {
	ID    string   `json:"id"`
	Alias string   `json:"alias"`
	Trees []string `json:"trees"`
}

func (s *Service) tombstonesPath() string { return filepath.Join(s.opts.Dir, "deleted.json") }

func (s *Service) readTombstones() []tombstone {
	var ts []tombstone
	if b, err := os.ReadFile(s.tombstonesPath()); err == nil {
		if err := json.Unmarshal(b, &ts); err != nil {
			s.log.Warn("ignoring a corrupt list of deleted templates", "path", s.tombstonesPath(), "err", err)
		}
	}
	return ts
}

func (s *Service) writeTombstones(ts []tombstone) error {
	if len(ts) == 0 {
		if err := os.Remove(s.tombstonesPath()); err != nil && !os.IsNotExist(err) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(ts)
	if err != nil {
		return err
	}
	tmp := filepath.Join(s.opts.Dir, ".tmp-deleted.json")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.tombstonesPath())
}

// pinLocked keeps tree for the build in progress buildID.
// +checklocks:s.mu
func (s *Service) pinLocked(buildID, tree string) {
	if tree == "" || filepath.IsAbs(tree) {
		return // a fence template's tree, not ours
	}
	if s.pins[buildID] == nil {
		s.pins[buildID] = map[string]bool{}
	}
	s.pins[buildID][tree] = true
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

func (s *Service) pin(buildID, tree string) {
	s.mu.Lock()
	s.pinLocked(buildID, tree)
	s.mu.Unlock()
}

// treesOf returns the trees a build record names.
func treesOf(b *Build) []string {
	out := slices.Clone(b.Layers)
	if b.Tree != "" {
		out = append(out, b.Tree)
	}
	return out
}

// collect runs one mark and sweep (see above). Without the sandbox
// manager (not wired yet) tombstones are all kept.
func (s *Service) collect(ctx context.Context) {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	s.sweepArchives()
	tombs := s.readTombstones()
	keepTombs, inFlight := s.liveTombstones(ctx, tombs)
	s.mu.Lock()
	keep := s.markLocked(keepTombs, inFlight)
	doomed := s.sweepLocked(keep)
	s.mu.Unlock()
	if len(tombs) != len(keepTombs) {
		if err := s.writeTombstones(keepTombs); err != nil {
			s.log.Warn("template layer collection: updating the deleted templates", "err", err)
		}
	}
	if len(doomed) == 0 {
		return
	}
	// The removal runs in the background (a tree is thousands of entries):
	// the trees are out of every path already, and a crash leaves .tmp-
	// names the next start removes.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t0 := time.Now()
		for _, p := range doomed {
			if err := os.RemoveAll(p); err != nil {
				s.log.Warn("template layer collection: removing a tree", "path", p, "err", err)
			}
		}
		s.log.Info("template layers collected", "trees", len(doomed), "took", time.Since(t0).Round(time.Millisecond))
	}()
}

// liveTombstones returns the tombstones a live sandbox still names (all
// of them when the sandboxes cannot be listed) and whether creates are in
// flight.
func (s *Service) liveTombstones(ctx context.Context, tombs []tombstone) (keep []tombstone, inFlight bool) {
	s.mu.Lock()
	sbs := s.opts.Sandboxes
	s.mu.Unlock()
	var live []LiveSandbox
	listed, inFlight := false, true
	if sbs != nil {
		inFlight = sbs.CreatesInFlight() > 0
		var err error
		if live, err = sbs.Live(ctx); err != nil {
			s.log.Warn("template layer collection: listing sandboxes", "err", err)
		} else {
			listed = true
		}
	}
	for _, t := range tombs {
		if !listed || slices.ContainsFunc(live, func(sb LiveSandbox) bool { return usesTemplate(sb.Template, t.ID, t.Alias) }) {
			keep = append(keep, t)
		}
	}
	return keep, inFlight
}

// markLocked returns the trees kept: named by a build record, a build in
// progress, a recent lease while creates are in flight, or a kept
// tombstone. Expired leases are dropped.
// +checklocks:s.mu
func (s *Service) markLocked(tombs []tombstone, inFlight bool) map[string]bool {
	keep := map[string]bool{}
	for _, b := range s.builds {
		for _, t := range treesOf(b) {
			keep[t] = true
		}
	}
	for _, set := range s.pins {
		for t := range set {
			keep[t] = true
		}
	}
	now := s.now()
	for t, at := range s.leases {
		if inFlight && now.Sub(at) < leaseTime {
			keep[t] = true
		} else {
			delete(s.leases, t)
		}
	}
	for _, t := range tombs {
		for _, tr := range t.Trees {
			keep[tr] = true
		}
	}
	return keep
}

// sweepLocked removes the cache entries whose tree is not kept, then
// renames every tree not kept out of the way and returns the new paths,
// for removal.
// +checklocks:s.mu
func (s *Service) sweepLocked(keep map[string]bool) []string {
	keys, _ := os.ReadDir(s.keysDir())
	for _, e := range keys {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") || !strings.HasSuffix(name, ".json") {
			continue
		}
		j, err := os.ReadFile(filepath.Join(s.keysDir(), name))
		var l layer
		if err == nil && json.Unmarshal(j, &l) == nil && (filepath.IsAbs(l.Tree) || keep[l.Tree]) {
			continue
		}
		if err := os.Remove(filepath.Join(s.keysDir(), name)); err != nil && !os.IsNotExist(err) {
			s.log.Warn("template layer collection: removing a cache entry", "key", name, "err", err)
		}
	}
	var doomed []string
	trees, _ := os.ReadDir(s.treesDir())
	for _, e := range trees {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") || keep[name] {
			continue
		}
		gone := filepath.Join(s.treesDir(), ".tmp-gc-"+name)
		if err := os.Rename(filepath.Join(s.treesDir(), name), gone); err != nil {
			s.log.Warn("template layer collection: removing a tree", "tree", name, "err", err)
			continue
		}
		doomed = append(doomed, gone)
	}
	return doomed
}

// usesTemplate reports whether a sandbox's template name names the
// template id (alias alias), with or without a tag or namespace.
func usesTemplate(name, id, alias string) bool {
	n, err := ParseName(name)
	return err == nil && (n.Alias == alias || n.Alias == id)
}
