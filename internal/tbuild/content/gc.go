package content

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Trees are collected by mark and sweep (Collect), which the owner of the
// records runs at start and after every template deletion. A tree is kept
// while something may still use it:
//
//   - a record names it (Collection.Records: the builds' results and the
//     layers every build went through, so their chain stays cached);
//   - an owner pinned it (Pin, Cached: a build in progress uses it; the
//     pin comes before the tree is renamed into place or handed out by the
//     cache);
//   - a sandbox create resolved it in the last leaseTime (Lease) and
//     creates are in flight (past their capacity check, not recorded yet),
//     so the create may not be recorded yet;
//   - a tombstone names it and Collection.Live says a live sandbox
//     (running or paused) still names the tombstone's template.
//
// Everything else under trees/ is swept, and the cache entries naming a
// swept tree go first. Crash safety: a deletion writes its tombstone
// (Bury: whole, renamed into place) before the caller removes its records;
// a cache entry is removed before its tree; a tree is renamed to .tmp-gc-*
// before it is removed, and .tmp-* leftovers are removed at Open. A crash
// at any point leaves at worst garbage the next collection removes, never
// a record or cache entry naming a missing tree as usable (a cache entry
// whose tree is gone is a miss).

// leaseTime is how long a tree a sandbox create resolved is kept without
// a record naming it while creates are in flight.
const leaseTime = 10 * time.Minute

// Tombstone is a deleted template whose trees wait for its last sandbox.
type Tombstone struct {
	ID    string   `json:"id"`
	Alias string   `json:"alias"`
	Trees []string `json:"trees"`
}

// Collection is what a collection keeps besides pins and leases.
type Collection struct {
	// Records are the trees the records name.
	Records []string
	// Live reports whether a live sandbox names a tombstone's template;
	// nil keeps every tombstone (the sandboxes could not be listed).
	Live func(Tombstone) bool
	// InFlight says creates are in flight: only then are leases kept.
	InFlight bool
	// Archives are the COPY archives (files hashes) builds in progress
	// name; see SweepArchives.
	Archives map[string]bool
}

func (st *Store) tombstonesPath() string { return filepath.Join(st.dir, "deleted.json") }

func (st *Store) readTombstones() []Tombstone {
	var ts []Tombstone
	if b, err := os.ReadFile(st.tombstonesPath()); err == nil {
		if err := json.Unmarshal(b, &ts); err != nil {
			st.log.Warn("ignoring a corrupt list of deleted templates", "path", st.tombstonesPath(), "err", err)
		}
	}
	return ts
}

func (st *Store) writeTombstones(ts []Tombstone) error {
	if len(ts) == 0 {
		if err := os.Remove(st.tombstonesPath()); err != nil && !os.IsNotExist(err) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(ts)
	if err != nil {
		return err
	}
	tmp := filepath.Join(st.dir, ".tmp-deleted.json")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, st.tombstonesPath())
}

// Bury records a tombstone, durably, before its template's records go.
func (st *Store) Bury(t Tombstone) error {
	st.gcMu.Lock()
	defer st.gcMu.Unlock()
	return st.writeTombstones(append(st.readTombstones(), t))
}

// Pin keeps tree for owner until Unpin. A fence template's tree (an
// absolute path) is not the store's and is not pinned.
func (st *Store) Pin(owner, tree string) {
	st.mu.Lock()
	st.pinLocked(owner, tree)
	st.mu.Unlock()
}

// +checklocks:st.mu
func (st *Store) pinLocked(owner, tree string) {
	if tree == "" || filepath.IsAbs(tree) {
		return
	}
	if st.pins[owner] == nil {
		st.pins[owner] = map[string]bool{}
	}
	st.pins[owner][tree] = true
}

// Pinned returns the trees owner has pinned.
func (st *Store) Pinned(owner string) []string {
	st.mu.Lock()
	defer st.mu.Unlock()
	var out []string
	for t := range st.pins[owner] {
		out = append(out, t)
	}
	return out
}

// Unpin drops owner's pins. Its caller records the trees it keeps (in
// Collection.Records) before.
func (st *Store) Unpin(owner string) {
	st.mu.Lock()
	delete(st.pins, owner)
	st.mu.Unlock()
}

// Lease keeps tree for leaseTime while creates are in flight: a sandbox
// create resolved it.
func (st *Store) Lease(tree string) {
	st.mu.Lock()
	st.leases[tree] = st.now()
	st.mu.Unlock()
}

// Collect runs one mark and sweep (see above). The removal of swept trees
// runs in the background (Close waits for it).
func (st *Store) Collect(c Collection) {
	st.gcMu.Lock()
	defer st.gcMu.Unlock()
	st.SweepArchives(c.Archives)
	tombs := st.readTombstones()
	keepTombs := tombs
	if c.Live != nil {
		keepTombs = nil
		for _, t := range tombs {
			if c.Live(t) {
				keepTombs = append(keepTombs, t)
			}
		}
	}
	st.mu.Lock()
	keep := st.markLocked(c, keepTombs)
	doomed := st.sweep(keep)
	st.mu.Unlock()
	if len(tombs) != len(keepTombs) {
		if err := st.writeTombstones(keepTombs); err != nil {
			st.log.Warn("template layer collection: updating the deleted templates", "err", err)
		}
	}
	if len(doomed) == 0 {
		return
	}
	// The removal runs in the background (a tree is thousands of entries):
	// the trees are out of every path already, and a crash leaves .tmp-
	// names the next start removes.
	st.wg.Go(func() {
		t0 := time.Now()
		for _, p := range doomed {
			if err := os.RemoveAll(p); err != nil {
				st.log.Warn("template layer collection: removing a tree", "path", p, "err", err)
			}
		}
		st.log.Info("template layers collected", "trees", len(doomed), "took", time.Since(t0).Round(time.Millisecond))
	})
}

// markLocked returns the trees kept: named by a record, a pin, a recent
// lease while creates are in flight, or a kept tombstone. Expired leases
// are dropped.
// +checklocks:st.mu
func (st *Store) markLocked(c Collection, tombs []Tombstone) map[string]bool {
	keep := map[string]bool{}
	for _, t := range c.Records {
		keep[t] = true
	}
	for _, set := range st.pins {
		for t := range set {
			keep[t] = true
		}
	}
	now := st.now()
	for t, at := range st.leases {
		if c.InFlight && now.Sub(at) < leaseTime {
			keep[t] = true
		} else {
			delete(st.leases, t)
		}
	}
	for _, t := range tombs {
		for _, tr := range t.Trees {
			keep[tr] = true
		}
	}
	return keep
}

// sweep removes the cache entries whose tree is not kept, then renames
// every tree not kept out of the way and returns the new paths, for
// removal.
func (st *Store) sweep(keep map[string]bool) []string {
	keys, _ := os.ReadDir(st.keysDir())
	for _, e := range keys {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") || !strings.HasSuffix(name, ".json") {
			continue
		}
		j, err := os.ReadFile(filepath.Join(st.keysDir(), name))
		var l Entry
		if err == nil && json.Unmarshal(j, &l) == nil && (filepath.IsAbs(l.Tree) || keep[l.Tree]) {
			continue
		}
		if err := os.Remove(filepath.Join(st.keysDir(), name)); err != nil && !os.IsNotExist(err) {
			st.log.Warn("template layer collection: removing a cache entry", "key", name, "err", err)
		}
	}
	var doomed []string
	trees, _ := os.ReadDir(st.treesDir())
	for _, e := range trees {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") || keep[name] {
			continue
		}
		gone := filepath.Join(st.treesDir(), ".tmp-gc-"+name)
		if err := os.Rename(filepath.Join(st.treesDir(), name), gone); err != nil {
			st.log.Warn("template layer collection: removing a tree", "tree", name, "err", err)
			continue
		}
		doomed = append(doomed, gone)
	}
	return doomed
}
