package content

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// Entry is a cache entry: the tree a chain key built and what its owner
// keeps beside it (for the builds, the build context after the step),
// stored as it is.
type Entry struct {
	Tree string          `json:"tree"`
	Ctx  json.RawMessage `json:"ctx"`
}

// Cached looks key up in the cache and pins its tree for owner, in one
// step, so that no collection removes the tree in between. A cache entry
// whose tree is gone is a miss.
func (st *Store) Cached(owner, key string) (Entry, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	j, err := os.ReadFile(filepath.Join(st.keysDir(), key+".json"))
	if err != nil {
		return Entry{}, false
	}
	var e Entry
	if json.Unmarshal(j, &e) != nil {
		return Entry{}, false
	}
	if _, err := os.Lstat(st.TreePath(e.Tree)); err != nil {
		return Entry{}, false
	}
	st.pinLocked(owner, e.Tree)
	return e, true
}

// Keep records a cache entry (written whole, then renamed).
func (st *Store) Keep(key string, e Entry) error {
	j, err := json.Marshal(e)
	if err != nil {
		return err
	}
	tmp := filepath.Join(st.keysDir(), ".tmp-"+key)
	if err := os.WriteFile(tmp, j, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(st.keysDir(), key+".json"))
}
