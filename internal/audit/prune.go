package audit

import (
	"errors"
	"io"
	"os"
	"path/filepath"
)

// prune applies retention (the writer's, or Open's before the writer
// starts): sealed segments whose last write is older than Retention are
// removed, oldest first and never the current one; before each removal a
// prune record names the first record kept and its prev, where Verify
// then starts. Output files older than Retention are removed too, and
// counted in a prune record.
func (l *Log) prune() {
	now := l.opts.Now()
	l.lastPrune = now
	if l.opts.Retention < 0 {
		return
	}
	cutoff := now.Add(-l.opts.Retention)
	segs, err := listSegments(l.dir)
	if err != nil {
		l.log.Warn("audit: listing segments for retention", "err", err)
		return
	}
	for i := 0; i+1 < len(segs); i++ {
		s, next := segs[i], segs[i+1]
		if l.f != nil && s.first >= l.segFirst {
			break
		}
		st, err := os.Lstat(filepath.Join(l.dir, s.name))
		if err != nil || !st.ModTime().Before(cutoff) {
			break
		}
		prev, err := firstPrev(filepath.Join(l.dir, next.name))
		if err != nil {
			l.log.Warn("audit: reading the segment after an expired one", "segment", next.name, "err", err)
			break
		}
		before := l.committed.Load()
		l.writeInternal(pending{time: now, typ: TypePrune, data: mustJSON(map[string]any{
			"segment": s.name, "first_kept": next.first, "prev": prev})})
		if l.committed.Load() == before {
			break // not recorded: not removed
		}
		if err := os.Remove(filepath.Join(l.dir, s.name)); err != nil {
			l.log.Warn("audit: removing an expired segment", "segment", s.name, "err", err)
			break
		}
		syncDir(l.dir)
		l.idx.mu.Lock()
		delete(l.idx.spans, s.name)
		l.idx.mu.Unlock()
	}
	if n := l.pruneOutputs(cutoff); n > 0 {
		l.writeInternal(pending{time: now, typ: TypePrune, data: mustJSON(map[string]any{"outputs": n})})
	}
}

// firstPrev is the prev of a segment's first record.
func firstPrev(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	l, err := newLineReader(f).next()
	if errors.Is(err, io.EOF) {
		return "", errors.New("empty segment")
	}
	if err != nil {
		return "", err
	}
	r, err := parseLine(l)
	if err != nil {
		return "", err
	}
	return r.Prev, nil
}
