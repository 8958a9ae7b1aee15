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
	// arcs indexes the archives, oldest first, and total is their size:
	// a Put prunes from the index instead of listing the directory, whose
	// length grows with every sandbox killed within the retention. The
	// directory is read again at Open and at every Prune.
	arcs  []arc
	total int64
}

type arc struct {
	name string
	mod  time.Time
	size int64
}

// readDir lists the archive directory (a variable for tests).
var readDir = os.ReadDir

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
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("archiving layer of %s: %w", id, err)
	}
	size := st.Size()
	if err := f.Close(); err != nil {
		return fmt.Errorf("archiving layer of %s: %w", id, err)
	}
	if err := os.Rename(tmp, filepath.Join(a.dir, id+".tar.gz")); err != nil {
		return fmt.Errorf("archiving layer of %s: %w", id, err)
	}
	ok = true
	a.add(arc{name: id + ".tar.gz", mod: a.now(), size: size})
	a.dropLocked(id)
	return nil
}

// add indexes an archive just written, replacing an older one of its name.
func (a *Archive) add(x arc) {
	if i := slices.IndexFunc(a.arcs, func(y arc) bool { return y.name == x.name }); i >= 0 {
		a.total -= a.arcs[i].size
		a.arcs = slices.Delete(a.arcs, i, i+1)
	}
	i, _ := slices.BinarySearchFunc(a.arcs, x.mod, func(y arc, t time.Time) int { return y.mod.Compare(t) })
	if i < len(a.arcs) {
		// Not the newest (the clock went back): keep the order.
		a.arcs = slices.Insert(a.arcs, i, x)
	} else {
		a.arcs = append(a.arcs, x)
	}
	a.total += x.size
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
	a.scanLocked()
	a.dropLocked(keep)
}

// scanLocked rebuilds the index from the directory, removing what a
// crash left half-written.
func (a *Archive) scanLocked() {
	ents, err := readDir(a.dir)
	if err != nil {
		return
	}
	a.arcs, a.total = a.arcs[:0], 0
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
		a.arcs = append(a.arcs, arc{name, info.ModTime(), info.Size()})
		a.total += info.Size()
	}
	// Oldest first; archives written within one tick of the clock that
	// stamps files go by name.
	slices.SortFunc(a.arcs, func(x, y arc) int {
		if c := x.mod.Compare(y.mod); c != 0 {
			return c
		}
		return strings.Compare(x.name, y.name)
	})
}

// dropLocked removes the expired archives, then the oldest while over
// the budget; keep's archive stays unless it alone is over the budget.
func (a *Archive) dropLocked(keep string) {
	now := a.now()
	kept := a.arcs[:0]
	for i, x := range a.arcs {
		expired := now.Sub(x.mod) > a.retention
		if !expired && a.total <= a.budget {
			// Oldest first: the rest is neither expired nor over.
			kept = append(kept, a.arcs[i:]...)
			break
		}
		over := a.total > a.budget && (x.name != keep+".tar.gz" || x.size > a.budget)
		if expired || over {
			os.Remove(filepath.Join(a.dir, x.name))
			a.total -= x.size
			continue
		}
		kept = append(kept, x)
	}
	clear(a.arcs[len(kept):])
	a.arcs = kept
}
