// Package downloads keeps the record of the package artifacts sandboxes
// fetched, as the egress gateway reports them, in the daemon's store.
//
// # Guarantees
//
//   - Every sandbox has a budget: its newest MaxPerSandbox records are
//     kept, older ones are dropped as new ones arrive; every field is
//     bounded and clean (longer text is cut, invalid UTF-8 and control
//     characters are replaced, a malformed digest is dropped), since what
//     the gateway reports comes from a sandbox's own requests.
//   - Records outlive their sandbox: they are removed Retention after they
//     were recorded (at Open, and then at most once an hour as new ones
//     arrive), whatever happened to the sandbox record.
//   - List tells a sandbox fence has no trace of (neither a sandbox record
//     nor a download) from one without downloads: the former is an error
//     wrapping api.ErrNotFound.
package downloads

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/store"
)

// Budgets.
const (
	// MaxPerSandbox is how many records of one sandbox are kept.
	MaxPerSandbox = 10_000
	// Retention is how long a record is kept.
	Retention = 7 * 24 * time.Hour
	// pruneEvery is how often RecordDownload prunes expired records.
	pruneEvery = time.Hour
	// Field bounds, in bytes.
	maxURL   = 2048
	maxField = 256
)

// Download is one record.
type Download struct {
	Time      time.Time
	Ecosystem string
	Name      string
	Version   string
	URL       string
	Size      int64
	SHA256    string
}

// Options configure a Log.
type Options struct {
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
	// MaxPerSandbox overrides MaxPerSandbox when positive (tests).
	MaxPerSandbox int
}

// Log is the download record. It is safe for concurrent use.
type Log struct {
	db   *store.Store
	now  func() time.Time
	keep int

	mu sync.Mutex
	// +checklocks:mu
	pruned time.Time // when expired records were last removed
}

// Open returns the log over db and removes the records past retention.
func Open(ctx context.Context, db *store.Store, opts Options) (*Log, error) {
	l := &Log{db: db, now: opts.Now, keep: opts.MaxPerSandbox}
	if l.now == nil {
		l.now = time.Now
	}
	if l.keep <= 0 {
		l.keep = MaxPerSandbox
	}
	if err := l.prune(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Log) prune(ctx context.Context) error {
	now := l.now()
	if _, err := l.db.DeleteDownloadsBefore(ctx, now.Add(-Retention)); err != nil {
		return err
	}
	l.mu.Lock()
	l.pruned = now
	l.mu.Unlock()
	return nil
}

// RecordDownload stores one download the gateway saw. The daemon's
// gateway recorder calls it.
func (l *Log) RecordDownload(ctx context.Context, d gateway.Download) error {
	if d.SandboxID == "" {
		return fmt.Errorf("recording download: no sandbox ID: %w", api.ErrInvalidArgument)
	}
	if len(d.SandboxID) > maxField {
		return fmt.Errorf("recording download: sandbox ID too long: %w", api.ErrInvalidArgument)
	}
	t := d.Time
	if t.IsZero() {
		t = l.now()
	}
	sum := d.SHA256
	if b, err := hex.DecodeString(sum); err != nil || len(b) != 32 {
		sum = ""
	} else {
		sum = hex.EncodeToString(b) // lower case
	}
	rec := &store.Download{
		SandboxID: d.SandboxID,
		Time:      t.UTC(),
		Ecosystem: clip(d.Ecosystem, maxField),
		Name:      clip(d.Name, maxField),
		Version:   clip(d.Version, maxField),
		URL:       clip(d.URL, maxURL),
		Size:      max(d.Size, 0),
		SHA256:    sum,
	}
	if err := l.db.InsertDownload(ctx, rec, l.keep); err != nil {
		return err
	}
	l.mu.Lock()
	due := l.now().Sub(l.pruned) >= pruneEvery
	l.mu.Unlock()
	if due {
		return l.prune(ctx)
	}
	return nil
}

// clip cuts s to at most n bytes, on a rune boundary, and replaces invalid
// UTF-8 (JSON could not carry it) and control characters (a terminal
// showing the record would obey them) with U+FFFD.
func clip(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return utf8.RuneError
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// List returns the downloads of sandbox id, oldest first. A sandbox fence
// has no record of, and no download of, gives an error wrapping
// api.ErrNotFound.
func (l *Log) List(ctx context.Context, id string) ([]Download, error) {
	recs, err := l.db.ListDownloads(ctx, id)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		known, err := l.db.SandboxKnown(ctx, id)
		if err != nil {
			return nil, err
		}
		if !known {
			return nil, fmt.Errorf("sandbox %s not found: %w", id, api.ErrNotFound)
		}
	}
	out := make([]Download, 0, len(recs))
	for _, r := range recs {
		out = append(out, Download{Time: r.Time, Ecosystem: r.Ecosystem, Name: r.Name, Version: r.Version,
			URL: r.URL, Size: r.Size, SHA256: r.SHA256})
	}
	return out, nil
}
