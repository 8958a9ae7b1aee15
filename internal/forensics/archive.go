// Package forensics keeps and assembles what fence can show of a sandbox
// after the fact: its filesystem changes against its template, its
// record, its audit records and its usage, as one tar.gz.
//
// # Guarantees
//
//   - An Archive keeps killed sandboxes' layers as DIR/<id>.tar.gz, 0600 in
//     a 0700 directory, written to a temporary file and renamed: a reader
//     never sees half an archive. Archives older than the retention go,
//     and the oldest go first while the directory holds more than the
//     budget; an archive larger than the budget is not kept.
//   - Layers are read by the backend without following symlinks (see
//     isolation.LayerReader); a symlink is kept as a symlink. Whiteouts
//     are listed in changes/.whiteouts, never made as device nodes.
//   - Every part is bounded: the layer by a byte cap (ErrTooLarge), the
//     audit records by MaxAuditBytes.
package forensics

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"golang.org/x/sys/unix"
)

// ErrTooLarge is returned when a layer holds more than the cap.
var ErrTooLarge = errors.New("the sandbox's filesystem changes exceed the export cap")

// Defaults of fence serve --forensics-retention and --forensics-budget.
const (
	DefaultRetention = 24 * time.Hour
	DefaultBudget    = 2 << 30
	// DefaultLayerCap bounds one layer in an export or an archive.
	DefaultLayerCap = 1 << 30
)

var idRE = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

// Archive is the directory of killed sandboxes' layers.
type Archive struct {
	dir       string
	retention time.Duration
	budget    int64
	now       func() time.Time
	mu        sync.Mutex // serialises Put and prune
	// zw is reused by every Put (under mu): a compressor's state is a
	// megabyte to allocate and clear, more than most layers cost to
	// compress.
	zw *gzip.Writer
}

// OpenArchive opens (creating) dir, keeping archives for retention and
// at most budget bytes in all (0: DefaultBudget).
func OpenArchive(dir string, retention time.Duration, budget int64) (*Archive, error) {
	if retention <= 0 {
		return nil, errors.New("forensics: retention must be positive")
	}
	if budget <= 0 {
		budget = DefaultBudget
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating forensics directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating forensics directory: %w", err)
	}
	a := &Archive{dir: dir, retention: retention, budget: budget, now: time.Now}
	a.mu.Lock()
	a.pruneLocked("")
	a.mu.Unlock()
	return a, nil
}

// Cap is the largest layer an archive takes: the smaller of the budget
// and DefaultLayerCap.
func (a *Archive) Cap() int64 { return min(a.budget, DefaultLayerCap) }

// Put archives a killed sandbox's layer: write gets the uncompressed tar
// stream (as isolation.LayerReader writes it). On error nothing is kept.
func (a *Archive) Put(id string, write func(w io.Writer) error) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("forensics: invalid sandbox id %q", id)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	f, err := os.CreateTemp(a.dir, ".tmp-"+id+"-*")
	if err != nil {
		return fmt.Errorf("archiving layer of %s: %w", id, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("archiving layer of %s: %w", id, err)
	}
	if a.zw == nil {
		a.zw, _ = gzip.NewWriterLevel(f, gzip.BestSpeed)
	} else {
		a.zw.Reset(f)
	}
	zw := a.zw
	if err := write(zw); err != nil {
		return fmt.Errorf("archiving layer of %s: %w", id, err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("archiving layer of %s: %w", id, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("archiving layer of %s: %w", id, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("archiving layer of %s: %w", id, err)
	}
	if err := os.Rename(tmp, filepath.Join(a.dir, id+".tar.gz")); err != nil {
		return fmt.Errorf("archiving layer of %s: %w", id, err)
	}
	ok = true
	a.pruneLocked(id)
	return nil
}

// Open returns the uncompressed tar stream of id's archived layer, or an
// error wrapping api.ErrNotFound when there is none (never archived,
// expired or dropped for the budget).
func (a *Archive) Open(id string) (io.ReadCloser, error) {
	if !idRE.MatchString(id) {
		return nil, fmt.Errorf("no archived layer of sandbox %q: %w", id, api.ErrNotFound)
	}
	fd, err := unix.Open(filepath.Join(a.dir, id+".tar.gz"), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("no archived layer of sandbox %q: %w", id, api.ErrNotFound)
		}
		return nil, fmt.Errorf("opening archived layer of %s: %w", id, err)
	}
	f := os.NewFile(uintptr(fd), id+".tar.gz")
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() || a.now().Sub(st.ModTime()) > a.retention {
		f.Close()
		return nil, fmt.Errorf("no archived layer of sandbox %q: %w", id, api.ErrNotFound)
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("reading archived layer of %s: %w", id, err)
	}
	return gzReadCloser{zr, f}, nil
}

type gzReadCloser struct {
	*gzip.Reader
	f *os.File
}

func (g gzReadCloser) Close() error { return errors.Join(g.Reader.Close(), g.f.Close()) }

// PruneEvery prunes every interval until ctx is done: expired archives
// go even when no sandbox is killed.
func (a *Archive) PruneEvery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.Prune()
		}
	}
}

// Prune removes expired archives, then the oldest while over the budget.
func (a *Archive) Prune() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pruneLocked("")
}

func (a *Archive) pruneLocked(keep string) {
	ents, err := os.ReadDir(a.dir)
	if err != nil {
		return
	}
	type arc struct {
		name string
		mod  time.Time
		size int64
	}
	var all []arc
	var total int64
	for _, e := range ents {
		name := e.Name()
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		if strings.HasPrefix(name, ".tmp-") {
			// A crash's leftover (Put holds the lock while it writes).
			os.Remove(filepath.Join(a.dir, name))
			continue
		}
		if !strings.HasSuffix(name, ".tar.gz") {
			continue
		}
		if a.now().Sub(info.ModTime()) > a.retention {
			os.Remove(filepath.Join(a.dir, name))
			continue
		}
		all = append(all, arc{name, info.ModTime(), info.Size()})
		total += info.Size()
	}
	slices.SortFunc(all, func(x, y arc) int { return x.mod.Compare(y.mod) })
	for _, x := range all {
		if total <= a.budget {
			break
		}
		// The newest is dropped too when it alone is over the budget.
		if x.name == keep+".tar.gz" && x.size <= a.budget {
			continue
		}
		os.Remove(filepath.Join(a.dir, x.name))
		total -= x.size
	}
}
