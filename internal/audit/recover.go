package audit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// lineType is the type of a record line as the writer lays it out
// (`{"seq":N,"time":"…","type":"…"`), "" if it is not there.
func lineType(ln []byte) string {
	const k = `","type":"`
	i := bytes.Index(ln[:min(len(ln), 128)], []byte(k))
	if i < 0 {
		return ""
	}
	rest := ln[i+len(k):]
	j := bytes.IndexByte(rest[:min(len(rest), 64)], '"')
	if j < 0 {
		return ""
	}
	return string(rest[:j])
}

// recover finds the end of the chain: the last complete line of the last
// non-empty segment. A torn final line (no newline) is cut away. It
// returns the records to write about what it found.
func (l *Log) recover() ([]pending, error) {
	var notes []pending
	segs, err := listSegments(l.dir)
	if err != nil {
		return nil, err
	}
	l.seq, l.prev = 0, genesis
	for i := len(segs) - 1; i >= 0; i-- {
		found, err := l.recoverSegment(segs[i], i == len(segs)-1, &notes)
		if err != nil {
			return nil, err
		}
		if found {
			break
		}
	}
	if h, err := readHead(l.dir); err == nil && h.Seq > l.seq {
		l.log.Error("audit: the log ends before its last signed checkpoint: records were removed", "head_seq", h.Seq, "last_seq", l.seq)
		notes = append(notes, pending{time: l.opts.Now(), typ: TypeTruncated,
			data: mustJSON(map[string]any{"head_seq": h.Seq, "last_seq": l.seq, "head_hash": h.Hash})})
	}
	return notes, nil
}

// recoverSegment reads one segment (newest: the last one listed), notes
// an unsigned prune record in it, cuts its torn end, and reports whether
// it holds a record: then the chain resumes after its last one, and the
// newest segment is opened for appending.
func (l *Log) recoverSegment(seg segment, newest bool, notes *[]pending) (found bool, err error) {
	path := filepath.Join(l.dir, seg.name)
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	lr := newLineReader(f)
	last, unsignedPrune, err := segmentEnd(lr)
	if err != nil {
		return false, fmt.Errorf("%s: %w", seg.name, err)
	}
	if unsignedPrune != nil {
		if r, err := parseLine(unsignedPrune); err == nil {
			l.log.Warn("audit: a prune record no checkpoint signs", "seq", r.Seq)
			*notes = append(*notes, pending{time: l.opts.Now(), typ: TypeRecovered,
				data: mustJSON(map[string]any{"segment": seg.name, "unsigned_prune": r.Seq})})
		}
	}
	if err := l.cutTorn(f, seg.name, lr.off, notes); err != nil {
		return false, err
	}
	if last == nil {
		if newest {
			// An empty newest segment (a crash after rotating): it is
			// made again, with the right name, on the first write.
			os.Remove(path)
		}
		return false, nil
	}
	r, err := parseLine(last)
	if err != nil {
		return false, fmt.Errorf("the last record of %s is not well-formed (%v); run fence audit verify", seg.name, err)
	}
	l.seq, l.prev = r.Seq, hexHash(last)
	if r.Type == TypeCheckpoint {
		l.lastCkRec = string(r.Data)
	} else {
		// The previous writer died before signing its last records:
		// the next checkpoint (periodic, or at Close) signs them.
		l.sinceCk = 1
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		return false, err
	}
	if newest {
		af, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return false, err
		}
		l.f, l.segFirst, l.segSize = af, seg.first, lr.off
	}
	return true, nil
}

// segmentEnd reads a segment's complete lines and gives back the last
// one and the first prune record after the segment's last checkpoint:
// the writer signs each one as it writes it, so such a record was not the
// writer's (a crash between the two leaves the segment it names in place).
func segmentEnd(lr *lineReader) (last, unsignedPrune []byte, err error) {
	for {
		ln, err := lr.next()
		if errors.Is(err, io.EOF) {
			return last, unsignedPrune, nil
		}
		if err != nil {
			return nil, nil, err
		}
		last = append(last[:0], ln...)
		switch lineType(ln) {
		case TypeCheckpoint:
			unsignedPrune = nil
		case TypePrune:
			if unsignedPrune == nil {
				unsignedPrune = bytes.Clone(ln)
			}
		}
	}
}

// cutTorn cuts what follows the last complete line (at off) of segment
// name, and notes it.
func (l *Log) cutTorn(f *os.File, name string, off int64, notes *[]pending) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	torn := st.Size() - off
	if torn <= 0 {
		return nil
	}
	if err := f.Truncate(off); err != nil {
		return fmt.Errorf("cutting the torn end of %s: %w", name, err)
	}
	f.Sync()
	l.log.Warn("audit: cut a torn final line", "segment", name, "bytes", torn)
	*notes = append(*notes, pending{time: l.opts.Now(), typ: TypeRecovered,
		data: mustJSON(map[string]any{"segment": name, "bytes": torn})})
	return nil
}
