package audit

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"time"
)

// prune applies retention and the size cap (the writer's, or Open's
// before the writer starts): sealed segments whose last write is older
// than Retention are removed, then, while the segments take more than
// MaxBytes, the oldest sealed ones; oldest first and never the current
// one. Before each removal a prune record names the segment, the first
// record kept and its prev (where Verify then starts) and why, and a
// checkpoint right after it signs it; both are on disk before the file
// goes. Output files older than Retention are removed too, and counted in
// a prune record.
func (l *Log) prune() {
	now := l.opts.Now()
	l.lastPrune = now
	l.pruneDue = false
	segs, err := listSegments(l.dir)
	if err != nil {
		l.log.Warn("audit: listing segments for retention", "err", err)
		return
	}
	sizes := make([]int64, len(segs))
	var total int64
	for i, s := range segs {
		if st, err := os.Lstat(filepath.Join(l.dir, s.name)); err == nil {
			sizes[i] = st.Size()
			total += st.Size()
		}
	}
	cutoff := now.Add(-l.opts.Retention)
	for i := 0; i+1 < len(segs); i++ {
		s, next := segs[i], segs[i+1]
		if l.f != nil && s.first >= l.segFirst {
			break
		}
		reason := ""
		if l.opts.Retention >= 0 {
			if st, err := os.Lstat(filepath.Join(l.dir, s.name)); err == nil && st.ModTime().Before(cutoff) {
				reason = "retention"
			}
		}
		if reason == "" && l.opts.MaxBytes > 0 && total > l.opts.MaxBytes {
			reason = "max-bytes"
		}
		if reason == "" {
			break
		}
		if !l.removeSegment(now, s, next, reason, sizes[i]) {
			break
		}
		total -= sizes[i]
	}
	if l.opts.Retention < 0 {
		return
	}
	if n := l.pruneOutputs(cutoff); n > 0 {
		l.writeInternal(pending{time: now, typ: TypePrune, data: mustJSON(map[string]any{"outputs": n})})
	}
}

// removeSegment records the removal of segment s (next is the one after
// it), signs that record, and removes s. It reports whether s is gone.
func (l *Log) removeSegment(now time.Time, s, next segment, reason string, size int64) bool {
	prev, err := firstPrev(filepath.Join(l.dir, next.name))
	if err != nil {
		l.log.Warn("audit: reading the segment after one to remove", "segment", next.name, "err", err)
		return false
	}
	// The record and the checkpoint that signs it, in one write.
	before := l.committed.Load()
	l.signNext = true
	l.commit([]pending{{time: now, typ: TypePrune, data: mustJSON(map[string]any{
		"segment": s.name, "first_kept": next.first, "prev": prev, "reason": reason, "bytes": size})}})
	if l.committed.Load() == before || l.sinceCk > 0 {
		return false // not recorded and signed: not removed
	}
	if err := os.Remove(filepath.Join(l.dir, s.name)); err != nil {
		l.log.Warn("audit: removing a segment", "segment", s.name, "err", err)
		return false
	}
	syncDir(l.dir)
	l.idx.mu.Lock()
	delete(l.idx.spans, s.name)
	l.idx.mu.Unlock()
	l.log.Info("audit: removed a segment", "segment", s.name, "reason", reason, "bytes", size)
	return true
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
