package audit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Filter selects records. Zero fields select everything.
type Filter struct {
	Sandbox      string
	Since, Until time.Time // inclusive bounds on Time
	Types        []string
	After        uint64 // only seq > After
	Limit        int    // at most this many (0: no limit)
	// Desc returns the newest matching records first (with Limit: the
	// Limit newest).
	Desc bool
	// Match, if set, must also accept the record.
	Match func(*Record) bool
}

func (f *Filter) match(r *Record) bool {
	if r.Seq <= f.After {
		return false
	}
	if f.Sandbox != "" && r.Sandbox != f.Sandbox {
		return false
	}
	if !f.Since.IsZero() && r.Time.Before(f.Since) {
		return false
	}
	if !f.Until.IsZero() && r.Time.After(f.Until) {
		return false
	}
	if len(f.Types) > 0 && !slices.Contains(f.Types, r.Type) {
		return false
	}
	return f.Match == nil || f.Match(r)
}

// segIndex caches the time span and the sandboxes of sealed segments
// (they never change) so that queries skip them unread.
type segIndex struct {
	mu    sync.Mutex
	spans map[string]span
}

type span struct {
	min, max  time.Time
	sandboxes map[string]struct{}
}

func (x *segIndex) get(name string) (span, bool) {
	if x == nil {
		return span{}, false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	s, ok := x.spans[name]
	return s, ok
}

func (x *segIndex) put(name string, s span) {
	if x == nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.spans == nil {
		x.spans = map[string]span{}
	}
	x.spans[name] = s
}

var errStop = errors.New("stop")

// scan calls fn with each record matching f (in seq order), and its line,
// up to seq upTo (0: all complete lines). Lines that do not parse are
// skipped (Verify reports them).
func scan(ctx context.Context, dir string, idx *segIndex, f Filter, upTo uint64, fn func(r *Record, line []byte) error) error {
	segs, err := listSegments(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for i, s := range segs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if upTo > 0 && s.first > upTo {
			break
		}
		sealed := i+1 < len(segs)
		if sealed && segs[i+1].first <= f.After+1 {
			continue
		}
		if sp, ok := idx.get(s.name); ok && sealed {
			if (!f.Since.IsZero() && sp.max.Before(f.Since)) || (!f.Until.IsZero() && sp.min.After(f.Until)) {
				continue
			}
			if _, ok := sp.sandboxes[f.Sandbox]; f.Sandbox != "" && !ok {
				continue
			}
		}
		sp := span{sandboxes: map[string]struct{}{}}
		stopped := false
		err := scanSegment(filepath.Join(dir, s.name), func(_ int, l []byte) error {
			r, err := parseLine(l)
			if err != nil {
				return nil
			}
			if upTo > 0 && r.Seq > upTo {
				stopped = true
				return errStop
			}
			if sp.min.IsZero() || r.Time.Before(sp.min) {
				sp.min = r.Time
			}
			if r.Time.After(sp.max) {
				sp.max = r.Time
			}
			if r.Sandbox != "" {
				sp.sandboxes[r.Sandbox] = struct{}{}
			}
			if !f.match(&r) {
				return nil
			}
			if err := fn(&r, l); err != nil {
				stopped = true
				return err
			}
			return nil
		})
		if errors.Is(err, errStop) {
			return nil
		}
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // pruned meanwhile
			}
			return err
		}
		if sealed && !stopped {
			idx.put(s.name, sp)
		}
	}
	return nil
}

// collect runs a query: ascending with Limit stops early; Desc keeps the
// Limit newest.
func collect(ctx context.Context, dir string, idx *segIndex, f Filter, upTo uint64) ([]Record, error) {
	var out []Record
	next := 0 // with Desc and Limit, out is a ring and next its oldest
	err := scan(ctx, dir, idx, f, upTo, func(r *Record, _ []byte) error {
		if f.Desc && f.Limit > 0 && len(out) == f.Limit {
			out[next] = *r
			next = (next + 1) % f.Limit
			return nil
		}
		out = append(out, *r)
		if !f.Desc && f.Limit > 0 && len(out) == f.Limit {
			return errStop
		}
		return nil
	})
	if errors.Is(err, errStop) {
		err = nil
	}
	if f.Desc {
		out = slices.Concat(out[next:], out[:next])
		slices.Reverse(out)
	}
	return out, err
}

// Query returns the committed records matching f, in seq order (newest
// first with Desc).
func (l *Log) Query(ctx context.Context, f Filter) ([]Record, error) {
	upTo := l.committed.Load()
	if upTo == 0 {
		return nil, nil // nothing committed (0 would mean no bound)
	}
	return collect(ctx, l.dir, &l.idx, f, upTo)
}

// Export calls fn with the line (exact bytes, no newline) of each record
// of the log in dataDir matching f, oldest first. It reads only complete
// lines, so it is safe while a daemon writes the log.
func Export(ctx context.Context, dataDir string, f Filter, fn func(r *Record, line []byte) error) error {
	n := 0
	err := scan(ctx, filepath.Join(dataDir, LogDir), nil, f, 0, func(r *Record, l []byte) error {
		if err := fn(r, l); err != nil {
			return err
		}
		n++
		if f.Limit > 0 && n >= f.Limit {
			return errStop
		}
		return nil
	})
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}

// ErrSlow ends a subscription whose reader fell behind its buffer.
var ErrSlow = errors.New("audit: subscriber too slow, disconnected")

// Subscription delivers records as they are committed.
type Subscription struct {
	// C receives each committed record matching the filter with seq >
	// From; it is closed when the subscription ends (see Err).
	C <-chan Record
	// From is the last seq committed when the subscription started:
	// earlier records are read with Query.
	From uint64

	c    chan Record
	f    Filter
	l    *Log
	once sync.Once
	mu   sync.Mutex
	err  error
}

// Subscribe starts a subscription with room for buffer records (at least
// 1). A subscriber that lets its buffer fill is ended with ErrSlow: it
// never slows the writer.
func (l *Log) Subscribe(f Filter, buffer int) *Subscription {
	c := make(chan Record, max(buffer, 1))
	s := &Subscription{C: c, c: c, f: f, l: l}
	l.subMu.Lock()
	defer l.subMu.Unlock()
	s.From = l.committed.Load()
	l.mu.RLock()
	closed := l.closed
	l.mu.RUnlock()
	if closed {
		s.end(errors.New("audit log closed"))
		return s
	}
	l.subs[s] = struct{}{}
	return s
}

// Err says why C was closed.
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close ends the subscription.
func (s *Subscription) Close() {
	s.l.subMu.Lock()
	delete(s.l.subs, s)
	s.l.subMu.Unlock()
	s.end(errors.New("closed"))
}

func (s *Subscription) end(err error) {
	s.once.Do(func() {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(s.c)
	})
}

// publish hands committed records to subscribers, never waiting.
func (l *Log) publish(recs []Record) {
	l.subMu.Lock()
	defer l.subMu.Unlock()
	if l.commitCh != nil {
		close(l.commitCh)
		l.commitCh = nil
	}
	for s := range l.subs {
		for i := range recs {
			if !s.f.match(&recs[i]) {
				continue
			}
			select {
			case s.c <- recs[i]:
			default:
				delete(l.subs, s)
				s.end(ErrSlow)
			}
			if s.Err() != nil {
				break
			}
		}
	}
}
