package tbuild

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tbuild/content"
)

// upload is an upload link. A link takes one PUT: the first one spends
// it, and a second one means that someone other than the client it was
// given to holds it (links carry no API key), so the archive the first
// PUT kept, which may be theirs, is dropped too.
type upload struct {
	hash    string
	expires time.Time
	spent   bool        // a PUT has started
	twice   bool        // a second PUT came
	kept    os.FileInfo // the archive the first PUT created, if it did
}

// FileStatus says whether the COPY archive with this hash is kept, and
// gives a token to upload it with (valid 30 minutes).
func (s *Service) FileStatus(templateID, hash string) (present bool, token string, err error) {
	if !hashRE.MatchString(hash) {
		//lint:ignore ST1005 E2B's wording, which the e2b SDKs show as it is.
		return false, "", fmt.Errorf("Invalid files hash: %w", api.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.names.Lookup(templateID); err != nil {
		return false, "", err
	}
	_, statErr := os.Stat(s.content.ArchivePath(hash))
	if statErr == nil {
		s.content.TouchArchive(hash)
	}
	if s.now().Sub(s.archivesSwept) >= content.ArchiveSweepEvery {
		s.archivesSwept = s.now()
		s.wg.Go(s.sweepArchives)
	}
	token = newID(40)
	now := s.now()
	for k, u := range s.uploads {
		if now.After(u.expires) {
			delete(s.uploads, k)
		}
	}
	if len(s.uploads) >= 10000 {
		return false, "", fmt.Errorf("too many uploads pending: %w", api.ErrResourceExhausted)
	}
	s.uploads[token] = &upload{hash: hash, expires: now.Add(30 * time.Minute)}
	return statErr == nil, token, nil
}

// Upload stores the COPY archive the token was issued for: a tar,
// gzipped or not, checked before it is kept. A token takes one upload,
// which spends it whatever its outcome. The files hash a client names
// cannot be recomputed from an archive (it covers the directories' inode
// sizes, which a tar does not carry), so the archive kept under a hash
// is written once: a later upload for the hash must hold the same files
// (content.Store.StoreArchive), and a second upload through one token is refused and
// drops the archive the first one kept.
func (s *Service) Upload(ctx context.Context, token string, body io.Reader) error {
	s.mu.Lock()
	u, ok := s.uploads[token]
	if ok && s.now().After(u.expires) {
		delete(s.uploads, token)
		ok = false
	}
	if ok && u.spent {
		u.twice = true
		s.dropKeptLocked(u)
		s.mu.Unlock()
		return fmt.Errorf("upload link was already used (a link takes one upload; ask for a new one): %w", api.ErrConflict)
	}
	if ok {
		u.spent = true
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("unknown or expired upload link: %w", api.ErrNotFound)
	}
	_, created, err := s.content.StoreArchive(ctx, u.hash, body, s.opts.MaxUploadBytes)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if created {
		u.kept, err = os.Lstat(s.content.ArchivePath(u.hash))
		if err != nil {
			return fmt.Errorf("keeping upload: %w", err)
		}
	}
	if u.twice {
		s.dropKeptLocked(u)
		return fmt.Errorf("upload link was used twice: the files are not kept: %w", api.ErrConflict)
	}
	return nil
}

// dropKeptLocked removes the archive u's upload created, if it is still
// the one kept under its hash.
// +checklocks:s.mu
func (s *Service) dropKeptLocked(u *upload) {
	if u.kept == nil {
		return
	}
	name := s.content.ArchivePath(u.hash)
	if fi, err := os.Lstat(name); err == nil && os.SameFile(fi, u.kept) {
		if err := os.Remove(name); err == nil {
			s.log.Warn("template files dropped: their upload link was used twice", "hash", u.hash)
		}
	}
	u.kept = nil
}
