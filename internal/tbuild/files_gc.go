package tbuild

import (
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The COPY archives clients upload (files/<hash>.tar) are kept for reuse:
// the SDKs ask whether a hash is there before uploading it again. An
// archive is kept while a build in progress names it, and for archiveKeep
// after its last use: an upload, a FileStatus that finds it (the client
// is about to name it in a build) or a build that copies it move its mtime
// to now. Older ones are removed at every collection (start, template
// deletion) and at most once per archiveSweepEvery from FileStatus, so a
// daemon that runs for months keeps only what its clients still use.
const (
	archiveKeep       = 24 * time.Hour
	archiveSweepEvery = time.Hour
)

// touchArchive marks the archive of hash as used now.
func (s *Service) touchArchive(hash string) {
	now := time.Now()
	_ = os.Chtimes(filepath.Join(s.filesDir(), hash+".tar"), now, now)
}

// sweepArchives removes the archives no build in progress names and none
// used in the last archiveKeep, and upload leftovers older than that.
func (s *Service) sweepArchives() {
	s.mu.Lock()
	keep := map[string]bool{}
	for id := range s.running {
		if b := s.builds[id]; b != nil && b.Spec != nil {
			for _, st := range b.Spec.Steps {
				if st.FilesHash != "" {
					keep[st.FilesHash+".tar"] = true
				}
			}
		}
	}
	s.mu.Unlock()
	ents, err := os.ReadDir(s.filesDir())
	if err != nil {
		return
	}
	removed := 0
	for _, e := range ents {
		name := e.Name()
		if keep[name] || !strings.HasSuffix(name, ".tar") && !strings.HasPrefix(name, ".tmp-") {
			continue
		}
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) < archiveKeep {
			continue
		}
		if err := os.Remove(filepath.Join(s.filesDir(), name)); err == nil {
			removed++
		}
	}
	if removed > 0 {
		s.log.Info("unused template file archives removed", "archives", removed)
	}
}
