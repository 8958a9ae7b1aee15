package audit

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// write appends the records in b (record k ends at ends[k], the first is
// seq first) to the segments, starting a new segment when the current one
// would pass SegmentSize (a record is never split; a segment holds at least
// one), and fsyncs. It returns how many records are in the files: on a
// failed write the segment is cut back to its size before it.
func (l *Log) write(b []byte, ends []int, first uint64) (int, error) {
	off, i := 0, 0
	for i < len(ends) {
		if l.f == nil {
			if err := l.rotate(first + uint64(i)); err != nil {
				return i, err
			}
		}
		j := i
		for j < len(ends) && (l.segSize+int64(ends[j]-off) <= l.opts.SegmentSize || (j == i && l.segSize == 0)) {
			j++
		}
		if j > i {
			chunk := b[off:ends[j-1]]
			if _, err := l.f.Write(chunk); err != nil {
				_ = l.f.Truncate(l.segSize)
				return i, err
			}
			l.segSize += int64(len(chunk))
			off, i = ends[j-1], j
		}
		if i < len(ends) {
			if err := l.seal(); err != nil {
				return i, err
			}
		}
	}
	if !l.opts.NoSync {
		if err := unix.Fdatasync(int(l.f.Fd())); err != nil {
			return len(ends), fmt.Errorf("fsync: %w", err)
		}
	}
	return len(ends), nil
}

// seal syncs and closes the current segment.
func (l *Log) seal() error {
	var err error
	if !l.opts.NoSync {
		err = unix.Fdatasync(int(l.f.Fd()))
	}
	l.f.Close()
	l.f = nil
	l.pruneDue = l.opts.MaxBytes > 0
	return err
}

// rotate starts a segment whose first record is first.
func (l *Log) rotate(first uint64) error {
	f, err := os.OpenFile(filepath.Join(l.dir, segName(first)), os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	if st.Size() != 0 {
		f.Close()
		return fmt.Errorf("segment %s exists and is not empty", segName(first))
	}
	syncDir(l.dir)
	l.f, l.segFirst, l.segSize = f, first, 0
	return nil
}
