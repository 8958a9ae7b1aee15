package content

import (
	"bufio"
	"context"
	"io"
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
// to now (TouchArchive). Older ones are removed at every collection
// (start, template deletion) and by SweepArchives, which the builds call
// at most once per ArchiveSweepEvery from FileStatus, so a daemon that
// runs for months keeps only what its clients still use.
const (
	archiveKeep       = 24 * time.Hour
	ArchiveSweepEvery = time.Hour
)

// ArchivePath is where the archive of a files hash is kept.
func (st *Store) ArchivePath(hash string) string {
	return filepath.Join(st.filesDir(), hash+".tar")
}

// TouchArchive marks the archive of hash as used now.
func (st *Store) TouchArchive(hash string) {
	now := time.Now()
	_ = os.Chtimes(st.ArchivePath(hash), now, now)
}

// StoreArchive checks an uploaded archive and keeps it under hash
// (storeArchive: written once; a malformed one keeps nothing).
func (st *Store) StoreArchive(ctx context.Context, hash string, body io.Reader, limit int64) (digest string, created bool, err error) {
	return storeArchive(ctx, st.filesDir(), hash, body, limit)
}

// OpenArchive opens the archive kept under a files hash and returns it
// with its files digest (FilesDigest), read back to its start.
func (st *Store) OpenArchive(ctx context.Context, hash string) (*os.File, string, error) {
	f, err := os.Open(st.ArchivePath(hash))
	if err != nil {
		return nil, "", err
	}
	digest, err := FilesDigest(ctx, bufio.NewReaderSize(f, 256<<10), false)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, "", err
	}
	return f, digest, nil
}

// SweepArchives removes the archives keep does not name (files hashes)
// and none used in the last archiveKeep, and upload leftovers older than
// that.
func (st *Store) SweepArchives(keep map[string]bool) {
	ents, err := os.ReadDir(st.filesDir())
	if err != nil {
		return
	}
	removed := 0
	for _, e := range ents {
		name := e.Name()
		if keep[strings.TrimSuffix(name, ".tar")] || !strings.HasSuffix(name, ".tar") && !strings.HasPrefix(name, ".tmp-") {
			continue
		}
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) < archiveKeep {
			continue
		}
		if err := os.Remove(filepath.Join(st.filesDir(), name)); err == nil {
			removed++
		}
	}
	if removed > 0 {
		st.log.Info("unused template file archives removed", "archives", removed)
	}
}
