package tbuild

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// cached looks key up in the cache and pins its tree for the build
// buildID.
func (s *Service) cached(buildID, key string) (layer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.cachedLocked(key)
	if ok {
		s.pinLocked(buildID, l.Tree)
	}
	return l, ok
}

// +checklocks:s.mu
func (s *Service) cachedLocked(key string) (layer, bool) {
	j, err := os.ReadFile(filepath.Join(s.keysDir(), key+".json"))
	if err != nil {
		return layer{}, false
	}
	var l layer
	if json.Unmarshal(j, &l) != nil {
		return layer{}, false
	}
	if _, err := os.Lstat(s.treePath(l.Tree)); err != nil {
		return layer{}, false
	}
	return l, true
}

// keep records a cache entry (written whole, then renamed).
func (s *Service) keep(key string, l layer) error {
	j, err := json.Marshal(l)
	if err != nil {
		return err
	}
	tmp := filepath.Join(s.keysDir(), ".tmp-"+key)
	if err := os.WriteFile(tmp, j, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(s.keysDir(), key+".json"))
}
