package audit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Types of the log's own records.
const (
	// TypeCheckpoint signs the record before it: data {seq, hash, sig, key}.
	TypeCheckpoint = "checkpoint"
	// TypeRecovered notes that Open cut a torn final line (a crash in the
	// middle of a write): data {segment, bytes}.
	TypeRecovered = "audit.recovered"
	// TypeDropped counts events Append dropped because the queue stayed
	// full: data {count}.
	TypeDropped = "audit.dropped"
	// TypePrune notes that a segment was removed by retention or the size
	// cap: data {segment, first_kept, prev, reason, bytes} (the first
	// record still kept and its prev hash, where verification starts; a
	// checkpoint follows it at once), or removed outputs: data {outputs}.
	TypePrune = "audit.prune"
	// TypeTruncated notes that Open found the log shorter than the last
	// checkpoint it had signed: data {head_seq, last_seq}.
	TypeTruncated = "audit.truncated"
)

// Record is one line of the log.
type Record struct {
	Seq     uint64          `json:"seq"`
	Time    time.Time       `json:"time"`
	Type    string          `json:"type"`
	Sandbox string          `json:"sandbox,omitempty"`
	Actor   string          `json:"actor,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
	// Prev is the hex SHA-256 of the previous record's line (its exact
	// bytes, without the newline); 64 zeros for the first record.
	Prev string `json:"prev"`
}

// genesis is the prev of the first record.
var genesis = strings.Repeat("0", 64)

// maxLine bounds a line a reader accepts; the writer's lines are far
// smaller (see maxData).
const maxLine = 1 << 20

// maxData bounds an event's data as stored; larger data is replaced by a
// note of its size.
const maxData = 64 << 10

// lineHash is the hash the next record's prev holds.
func lineHash(line []byte) [32]byte { return sha256.Sum256(line) }

// body is the part of a line the appender builds (everything but seq and
// prev): `"time":…,"type":…[,"sandbox":…][,"actor":…][,"data":…]`.
func body(t time.Time, typ, sandbox, actor string, data json.RawMessage) []byte {
	b := make([]byte, 0, 96+len(typ)+len(sandbox)+len(actor)+len(data))
	b = append(b, `"time":"`...)
	b = t.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","type":`...)
	b = appendString(b, typ)
	if sandbox != "" {
		b = append(b, `,"sandbox":`...)
		b = appendString(b, sandbox)
	}
	if actor != "" {
		b = append(b, `,"actor":`...)
		b = appendString(b, actor)
	}
	if len(data) > 0 {
		b = append(b, `,"data":`...)
		b = append(b, data...)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// line is a full record line, without the newline.
func line(dst []byte, seq uint64, body []byte, prev string) []byte {
	dst = append(dst, `{"seq":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, ',')
	dst = append(dst, body...)
	dst = append(dst, `,"prev":"`...)
	dst = append(dst, prev...)
	return append(dst, `"}`...)
}

// marshalData stores an event's data: JSON, bounded.
func marshalData(d map[string]any) json.RawMessage {
	if len(d) == 0 {
		return nil
	}
	b, err := json.Marshal(d)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"error": "data could not be stored: " + err.Error()})
	}
	if len(b) > maxData {
		b, _ = json.Marshal(map[string]any{"truncated": true, "size": len(b)})
	}
	return b
}

// parseLine parses one line (without its newline) into a record.
func parseLine(l []byte) (Record, error) {
	var r Record
	if len(l) == 0 || l[0] != '{' {
		return r, errors.New("not a JSON object")
	}
	if err := json.Unmarshal(l, &r); err != nil {
		return r, err
	}
	if r.Seq == 0 {
		return r, errors.New("no seq")
	}
	if len(r.Prev) != 64 {
		return r, errors.New("no prev hash")
	}
	if _, err := hex.DecodeString(r.Prev); err != nil {
		return r, fmt.Errorf("prev: %w", err)
	}
	if r.Type == "" {
		return r, errors.New("no type")
	}
	return r, nil
}

// Segments are files <first seq, 20 digits>.log in the log directory.
const segSuffix = ".log"

func segName(first uint64) string { return fmt.Sprintf("%020d%s", first, segSuffix) }

type segment struct {
	name  string
	first uint64
}

// parseSegName is the first seq a segment's name says.
func parseSegName(n string) (uint64, error) {
	if !strings.HasSuffix(n, segSuffix) || len(n) != 20+len(segSuffix) {
		return 0, fmt.Errorf("not a segment name: %q", n)
	}
	return strconv.ParseUint(strings.TrimSuffix(n, segSuffix), 10, 64)
}

// listSegments returns the log's segments, oldest first.
func listSegments(dir string) ([]segment, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []segment
	for _, e := range ents {
		n := e.Name()
		if !e.Type().IsRegular() {
			continue
		}
		first, err := parseSegName(n)
		if err != nil {
			continue
		}
		out = append(out, segment{name: n, first: first})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].first < out[j].first })
	return out, nil
}

// lineReader yields the complete lines of a segment: a final line without
// its newline (a write in progress, or torn) is not yielded.
type lineReader struct {
	br  *bufio.Reader
	n   int   // lines yielded
	off int64 // offset after the last complete line
}

func newLineReader(r io.Reader) *lineReader {
	return &lineReader{br: bufio.NewReaderSize(r, 256<<10)}
}

var errLongLine = errors.New("line longer than 1 MiB")

// next returns the next complete line without its newline. The slice is
// valid until the next call.
func (lr *lineReader) next() ([]byte, error) {
	var buf []byte
	for {
		frag, err := lr.br.ReadSlice('\n')
		if err == nil {
			lr.n++
			if buf != nil {
				buf = append(buf, frag...)
				lr.off += int64(len(buf))
				return buf[:len(buf)-1], nil
			}
			lr.off += int64(len(frag))
			return frag[:len(frag)-1], nil
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			buf = append(buf, frag...)
			if len(buf) > maxLine {
				return nil, errLongLine
			}
			continue
		}
		return nil, err // io.EOF: a partial final line is dropped
	}
}

// scanSegment calls fn for each complete line of a segment.
func scanSegment(path string, fn func(lineNo int, l []byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	lr := newLineReader(f)
	for {
		l, err := lr.next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s line %d: %w", filepath.Base(path), lr.n+1, err)
		}
		if err := fn(lr.n, l); err != nil {
			return err
		}
	}
}

// hexHash is the hex of a line's hash.
func hexHash(l []byte) string {
	h := lineHash(l)
	return hex.EncodeToString(h[:])
}
