package content

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Options configure a Store.
type Options struct {
	// Dir holds trees/, layers/ (the cache), files/ (COPY archives) and
	// deleted.json (the tombstones). Required.
	Dir    string
	Logger *slog.Logger
	Now    func() time.Time
}

// Store owns the content of template builds under one directory. It is
// safe for concurrent use.
type Store struct {
	dir string
	log *slog.Logger
	now func() time.Time

	mu sync.Mutex
	// +checklocks:mu
	pins map[string]map[string]bool // owner → trees it uses
	// +checklocks:mu
	leases map[string]time.Time // tree → when a sandbox create last resolved it

	gcMu sync.Mutex // one collection, or tombstone change, at a time
	wg   sync.WaitGroup
}

// Open makes the store's directories and removes the half-made trees,
// cache entries and archives a crashed daemon left.
func Open(opts Options) (*Store, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("content: Dir is required")
	}
	st := &Store{dir: opts.Dir, log: opts.Logger, now: opts.Now,
		pins: map[string]map[string]bool{}, leases: map[string]time.Time{}}
	if st.log == nil {
		st.log = slog.New(slog.DiscardHandler)
	}
	if st.now == nil {
		st.now = time.Now
	}
	for _, d := range []string{st.treesDir(), st.filesDir(), st.keysDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	if err := os.Chmod(st.treesDir(), 0o755); err != nil {
		return nil, err
	}
	st.removeTemp()
	return st, nil
}

// Close waits for the removals of collected trees to end.
func (st *Store) Close() { st.wg.Wait() }

func (st *Store) treesDir() string { return filepath.Join(st.dir, "trees") }
func (st *Store) filesDir() string { return filepath.Join(st.dir, "files") }
func (st *Store) keysDir() string  { return filepath.Join(st.dir, "layers") }

// removeTemp removes the half-made trees and uploads of a crashed daemon.
func (st *Store) removeTemp() {
	for _, dir := range []string{st.treesDir(), st.filesDir(), st.keysDir()} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".tmp-") {
				p := filepath.Join(dir, e.Name())
				st.log.Info("removing an unfinished template layer", "path", p)
				if err := os.RemoveAll(p); err != nil {
					st.log.Warn("removing an unfinished template layer", "path", p, "err", err)
				}
			}
		}
	}
}

// TreePath is the absolute path of a tree (a fence template's tree is
// named by its absolute path, and is its own path).
func (st *Store) TreePath(tree string) string {
	if filepath.IsAbs(tree) {
		return tree
	}
	return filepath.Join(st.treesDir(), tree)
}

// TempDir makes a directory for a tree in the making (mode 0755; a
// .tmp- name, removed at the next Open if it is left behind).
func (st *Store) TempDir() (string, error) {
	tmp, err := os.MkdirTemp(st.treesDir(), ".tmp-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	return tmp, nil
}

// TempFile makes a spool file beside the trees (a .tmp- name).
func (st *Store) TempFile() (*os.File, error) {
	return os.CreateTemp(st.treesDir(), ".tmp-layer-")
}

// Commit renames the finished tree tmp into place as name. When a tree of
// that name is there already (the same content: names are content keys)
// it is kept and tmp is left for the caller to remove.
func (st *Store) Commit(tmp, name string) error {
	dst := filepath.Join(st.treesDir(), name)
	if _, err := os.Lstat(dst); err == nil {
		return nil
	}
	return os.Rename(tmp, dst)
}

// Place renames the finished tree tmp into place as the new name name.
func (st *Store) Place(tmp, name string) error {
	return os.Rename(tmp, filepath.Join(st.treesDir(), name))
}
