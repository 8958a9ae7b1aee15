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
		path := filepath.Join(l.dir, segs[i].name)
		f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		lr := newLineReader(f)
		var last []byte
		// A prune record after the segment's last checkpoint: the writer
		// signs each one as it writes it, so it was not the writer's (a
		// crash between the two leaves the segment it names in place).
		var unsignedPrune []byte
		for {
			ln, err := lr.next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %w", segs[i].name, err)
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
		if unsignedPrune != nil {
			if r, err := parseLine(unsignedPrune); err == nil {
				l.log.Warn("audit: a prune record no checkpoint signs", "seq", r.Seq)
				notes = append(notes, pending{time: l.opts.Now(), typ: TypeRecovered,
					data: mustJSON(map[string]any{"segment": segs[i].name, "unsigned_prune": r.Seq})})
			}
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		if torn := st.Size() - lr.off; torn > 0 {
			if err := f.Truncate(lr.off); err != nil {
				f.Close()
				return nil, fmt.Errorf("cutting the torn end of %s: %w", segs[i].name, err)
			}
			f.Sync()
			l.log.Warn("audit: cut a torn final line", "segment", segs[i].name, "bytes", torn)
			notes = append(notes, pending{time: l.opts.Now(), typ: TypeRecovered,
				data: mustJSON(map[string]any{"segment": segs[i].name, "bytes": torn})})
		}
		if last == nil {
			f.Close()
			if i == len(segs)-1 {
				// An empty newest segment (a crash after rotating): it is
				// made again, with the right name, on the first write.
				os.Remove(path)
			}
			continue
		}
		r, err := parseLine(last)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("the last record of %s is not well-formed (%v); run fence audit verify", segs[i].name, err)
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
			f.Close()
			return nil, err
		}
		if i == len(segs)-1 {
			f.Close()
			f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, err
			}
			l.f, l.segFirst, l.segSize = f, segs[i].first, lr.off
		} else {
			f.Close()
		}
		break
	}
	if h, err := readHead(l.dir); err == nil && h.Seq > l.seq {
		l.log.Error("audit: the log ends before its last signed checkpoint: records were removed", "head_seq", h.Seq, "last_seq", l.seq)
		notes = append(notes, pending{time: l.opts.Now(), typ: TypeTruncated,
			data: mustJSON(map[string]any{"head_seq": h.Seq, "last_seq": l.seq, "head_hash": h.Hash})})
	}
	return notes, nil
}
