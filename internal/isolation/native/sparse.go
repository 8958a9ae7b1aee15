package native

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Files with holes.
//
// A sandbox makes a file of any apparent size for nothing (`truncate -s
// 15T f`): only the blocks it writes count against its disk. Whatever
// reads a layer's files on the host therefore goes by data extents
// (SEEK_DATA, SEEK_HOLE), never by apparent size: a hole is neither read,
// nor hashed byte by byte, nor written to a copy (which stays sparse),
// nor charged. The work is bounded by the blocks the file has, which the
// sandbox's disk limit bounds; the context is checked between chunks, so
// a cancelled request stops in the middle of a file.
//
// A file's hash (isolation.FileChange.SHA256) is the SHA-256 of its bytes
// when it has no hole, what sha256sum prints. A file with a hole hashes
// its hole map with its data: the SHA-256 of sparseHashMagic, the size
// (8 bytes, big-endian), then for each data extent in order its offset
// and length (8 bytes each, big-endian) and its bytes. Two files with the
// same bytes but different holes (or a hole against written zeros) hash
// differently; a copy that keeps the holes hashes the same.

// sparseHashMagic starts the hash of a file with holes.
const sparseHashMagic = "fence-sparse-sha256-v1\x00"

// fileChunk is the most read at once between checks of the context.
const fileChunk = 256 << 10

// errShortExtent is reported when a file shrinks while it is read.
var errShortExtent = errors.New("file shrank while read")

// dataExtents calls fn with each data extent [from, to) of the regular
// file fd below size, in order. Where the filesystem cannot tell holes
// (no SEEK_DATA), the whole file is one extent.
func dataExtents(ctx context.Context, fd int, size int64, fn func(from, to int64) error) error {
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // a hole up to the end
		}
		if errors.Is(err, unix.EINVAL) && off == 0 {
			return fn(0, size) // no hole support here
		}
		if err != nil {
			return fmt.Errorf("finding data: %w", err)
		}
		if data >= size {
			return nil
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("finding a hole: %w", err)
		}
		hole = min(hole, size)
		if hole <= data { // a file changing under us: never loop
			return nil
		}
		if err := fn(data, hole); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// sparseReader reads a regular file of a layer extent by extent.
type sparseReader struct {
	ctx context.Context
	f   *os.File
	fd  int
	// size is the file's size when it was opened: what is read and
	// hashed (data appended later is not).
	size int64
	buf  []byte
	// charge is called with the bytes of each chunk before it is read
	// (nil: nothing is charged).
	charge func(n int64) error
}

// sum hashes the file (see the note on files with holes above),
// writing each data extent to w at its offset when w is not nil, and
// returns the hash and the data bytes read. A file that shrinks while it
// is read is hashed as far as it was read.
func (r *sparseReader) sum(w io.WriterAt) (string, int64, error) {
	h := sha256.New()
	n, err := r.read(h, w)
	if err != nil {
		return "", n, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// read writes each data extent to w at its offset and, when h is not
// nil, hashes the file into h; it returns the data bytes read.
func (r *sparseReader) read(h hash.Hash, w io.WriterAt) (int64, error) {
	if r.buf == nil {
		r.buf = make([]byte, fileChunk)
	}
	var read int64
	first, sparse := true, false
	err := dataExtents(r.ctx, r.fd, r.size, func(from, to int64) error {
		if first {
			first, sparse = false, from != 0 || to != r.size
			if sparse && h != nil {
				writeSparseHeader(h, r.size)
			}
		}
		if sparse && h != nil {
			var x [16]byte
			binary.BigEndian.PutUint64(x[:8], uint64(from))
			binary.BigEndian.PutUint64(x[8:], uint64(to-from))
			h.Write(x[:])
		}
		n, err := r.extent(h, w, from, to)
		read += n
		return err
	})
	if errors.Is(err, errShortExtent) {
		err = nil
	}
	if err != nil {
		return read, err
	}
	if first && r.size > 0 && h != nil { // a hole and nothing else
		writeSparseHeader(h, r.size)
	}
	return read, nil
}

func writeSparseHeader(h hash.Hash, size int64) {
	h.Write([]byte(sparseHashMagic))
	var x [8]byte
	binary.BigEndian.PutUint64(x[:], uint64(size))
	h.Write(x[:])
}

// extent reads [from, to) of the file a chunk at a time into h and w;
// the file ending early is errShortExtent.
func (r *sparseReader) extent(h hash.Hash, w io.WriterAt, from, to int64) (int64, error) {
	var read int64
	for off := from; off < to; {
		if err := r.ctx.Err(); err != nil {
			return read, err
		}
		n := min(int64(len(r.buf)), to-off)
		if r.charge != nil {
			if err := r.charge(n); err != nil {
				return read, err
			}
		}
		got, err := r.f.ReadAt(r.buf[:n], off)
		read += int64(got)
		if h != nil {
			h.Write(r.buf[:got])
		}
		if w != nil && got > 0 {
			if _, werr := w.WriteAt(r.buf[:got], off); werr != nil {
				return read, werr
			}
		}
		if err == io.EOF || (err == nil && got == 0) {
			return read, errShortExtent
		}
		if err != nil {
			return read, err
		}
		off += int64(got)
	}
	return read, nil
}

// seqWriter turns the ordered WriteAt calls of sparseReader.read into a
// stream: the gaps (holes) are written as zeros, without reading them.
type seqWriter struct {
	w   io.Writer
	pos int64
}

func (s *seqWriter) WriteAt(p []byte, off int64) (int, error) {
	if off < s.pos {
		return 0, fmt.Errorf("writing at %d after %d: out of order", off, s.pos)
	}
	if err := s.pad(off); err != nil {
		return 0, err
	}
	n, err := s.w.Write(p)
	s.pos += int64(n)
	return n, err
}

// pad writes zeros up to off.
func (s *seqWriter) pad(off int64) error {
	if off <= s.pos {
		return nil
	}
	n, err := io.CopyN(s.w, zeros{}, off-s.pos)
	s.pos += n
	return err
}
