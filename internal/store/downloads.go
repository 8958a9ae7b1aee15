package store

import (
	"context"
	"fmt"
	"time"
)

// Download is one package artifact a sandbox fetched.
type Download struct {
	SandboxID string
	Time      time.Time
	Ecosystem string
	Name      string
	Version   string
	URL       string
	Size      int64
	SHA256    string
}

// InsertDownload adds a download record and then drops the oldest records
// of the same sandbox beyond the newest keep (0: no cap), in one
// transaction.
func (s *Store) InsertDownload(ctx context.Context, d *Download, keep int) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("recording download: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO downloads (sandbox_id, time, ecosystem, name, version, url, size, sha256)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		d.SandboxID, d.Time.UnixNano(), d.Ecosystem, d.Name, d.Version, d.URL, d.Size, d.SHA256); err != nil {
		return fmt.Errorf("recording download: %w", err)
	}
	if keep > 0 {
		// The index on (sandbox_id, seq) makes this a walk of at most
		// keep+1 index entries.
		if _, err := tx.ExecContext(ctx, `DELETE FROM downloads WHERE sandbox_id = ? AND seq <= (
			SELECT seq FROM downloads WHERE sandbox_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)`,
			d.SandboxID, d.SandboxID, keep); err != nil {
			return fmt.Errorf("trimming downloads: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("recording download: %w", err)
	}
	return nil
}

// ListDownloads returns the download records of a sandbox, oldest first.
func (s *Store) ListDownloads(ctx context.Context, sandboxID string) ([]Download, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT sandbox_id, time, ecosystem, name, version, url, size, sha256
		FROM downloads WHERE sandbox_id = ? ORDER BY seq`, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("listing downloads: %w", err)
	}
	defer rows.Close()
	var out []Download
	for rows.Next() {
		var (
			d Download
			t int64
		)
		if err := rows.Scan(&d.SandboxID, &t, &d.Ecosystem, &d.Name, &d.Version, &d.URL, &d.Size, &d.SHA256); err != nil {
			return nil, fmt.Errorf("listing downloads: %w", err)
		}
		d.Time = time.Unix(0, t).UTC()
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing downloads: %w", err)
	}
	return out, nil
}

// SandboxKnown reports whether the store has a record of sandbox id, or
// download records of it (they may outlive the sandbox record).
func (s *Store) SandboxKnown(ctx context.Context, id string) (bool, error) {
	var known bool
	err := s.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM sandboxes WHERE id = ?)
		OR EXISTS (SELECT 1 FROM downloads WHERE sandbox_id = ?)`, id, id).Scan(&known)
	if err != nil {
		return false, fmt.Errorf("looking up sandbox %s: %w", id, err)
	}
	return known, nil
}

// DeleteDownloadsBefore removes the download records older than t and
// returns how many it removed.
func (s *Store) DeleteDownloadsBefore(ctx context.Context, t time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM downloads WHERE time < ?`, t.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("pruning downloads: %w", err)
	}
	return res.RowsAffected()
}
