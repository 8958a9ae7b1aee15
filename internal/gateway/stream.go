package gateway

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"hash"
	"io"
	"sync/atomic"
)

const streamChunk = 32 << 10

// errPlaceholderLeak is returned by a scanned request body once it found
// a placeholder; the transport then aborts the upstream request.
var errPlaceholderLeak = errors.New("gateway: placeholder in request body")

// needle is one byte string a stream is scanned for.
type needle struct {
	find    []byte
	replace []byte // for replaceReader
	secret  string // for leakReader: the binding's secret name
}

// leakReader passes a request body through while scanning it for
// placeholders. It holds back the last len(longest)-1 bytes it has seen
// until more arrive (or the body ends), so a placeholder split across
// reads is found before any of its bytes are passed on. On a find it
// reports the secret to hit and fails every later Read.
type leakReader struct {
	src     io.ReadCloser
	needles []needle
	keep    int
	buf     []byte // bytes seen and scanned but not yet passed on, at buf[off:]
	off     int
	ready   int // buf[off:off+ready] may be passed on
	eof     bool
	err     error
	hit     func(secret string)
}

func newLeakReader(src io.ReadCloser, needles []needle, hit func(string)) *leakReader {
	longest := 0
	for _, n := range needles {
		longest = max(longest, len(n.find))
	}
	return &leakReader{src: src, needles: needles, keep: longest - 1, hit: hit}
}

func (l *leakReader) Read(p []byte) (int, error) {
	for l.ready == 0 {
		if l.err != nil {
			return 0, l.err
		}
		if l.eof {
			return 0, io.EOF
		}
		if l.off > 0 {
			n := copy(l.buf, l.buf[l.off:])
			l.buf, l.off = l.buf[:n], 0
		}
		if cap(l.buf)-len(l.buf) < streamChunk/2 {
			nb := make([]byte, len(l.buf), len(l.buf)+streamChunk)
			copy(nb, l.buf)
			l.buf = nb
		}
		scanFrom := max(0, len(l.buf)-l.keep)
		n, err := l.src.Read(l.buf[len(l.buf):cap(l.buf)])
		l.buf = l.buf[:len(l.buf)+n]
		for _, nd := range l.needles {
			if bytes.Contains(l.buf[scanFrom:], nd.find) {
				l.err = errPlaceholderLeak
				l.buf = nil
				l.hit(nd.secret)
				return 0, l.err
			}
		}
		switch {
		case err == io.EOF:
			l.eof = true
			l.ready = len(l.buf)
		case err != nil:
			l.err = err
			l.buf = nil
			return 0, err
		default:
			l.ready = max(0, len(l.buf)-l.keep)
		}
	}
	n := copy(p, l.buf[l.off:l.off+l.ready])
	l.off += n
	l.ready -= n
	return n, nil
}

func (l *leakReader) Close() error { return l.src.Close() }

// replaceReader streams src with every needle's find replaced by its
// replace (the earliest match wins, then the longest). It holds back the
// last len(longest)-1 bytes until more arrive, so a value split across
// reads is still replaced. If src fails before its end the held-back
// bytes are dropped, never passed on: they may be the start of a value.
type replaceReader struct {
	src     io.ReadCloser
	needles []needle
	keep    int
	in      []byte // unmatched input carried over
	out     []byte // ready output at out[off:]
	off     int
	err     error
	atEOF   func() // called once, when src ends cleanly, before io.EOF is returned
}

func newReplaceReader(src io.ReadCloser, needles []needle, atEOF func()) *replaceReader {
	longest := 0
	for _, n := range needles {
		longest = max(longest, len(n.find))
	}
	return &replaceReader{src: src, needles: needles, keep: longest - 1, atEOF: atEOF}
}

func (r *replaceReader) Read(p []byte) (int, error) {
	for r.off == len(r.out) {
		if r.err != nil {
			return 0, r.err
		}
		r.out, r.off = r.out[:0], 0
		if cap(r.in)-len(r.in) < streamChunk/2 {
			nb := make([]byte, len(r.in), len(r.in)+streamChunk)
			copy(nb, r.in)
			r.in = nb
		}
		n, err := r.src.Read(r.in[len(r.in):cap(r.in)])
		r.in = r.in[:len(r.in)+n]
		if err != nil && err != io.EOF {
			r.in, r.err = nil, err
			return 0, err
		}
		i := 0
		for {
			at, which := -1, -1
			for k, nd := range r.needles {
				j := bytes.Index(r.in[i:], nd.find)
				if j >= 0 && (at < 0 || j < at || (j == at && len(nd.find) > len(r.needles[which].find))) {
					at, which = j, k
				}
			}
			if at < 0 || err == nil && i+at+r.keep >= len(r.in) {
				// None, or one that a longer needle starting at the
				// same place might still cover once more bytes come.
				break
			}
			r.out = append(r.out, r.in[i:i+at]...)
			r.out = append(r.out, r.needles[which].replace...)
			i += at + len(r.needles[which].find)
		}
		if err == io.EOF {
			r.out = append(r.out, r.in[i:]...)
			r.in = r.in[:0]
			r.err = io.EOF
			if r.atEOF != nil {
				r.atEOF()
			}
		} else {
			if rest := len(r.in) - i; rest > r.keep {
				r.out = append(r.out, r.in[i:len(r.in)-r.keep]...)
				i = len(r.in) - r.keep
			}
			m := copy(r.in, r.in[i:])
			r.in = r.in[:m]
		}
	}
	n := copy(p, r.out[r.off:])
	r.off += n
	return n, nil
}

func (r *replaceReader) Close() error { return r.src.Close() }

// replaceAll applies needles to a short string (a header value).
func replaceAll(s string, needles []needle) string {
	for _, nd := range needles {
		if len(nd.find) > 0 && bytes.Contains([]byte(s), nd.find) {
			s = string(bytes.ReplaceAll([]byte(s), nd.find, nd.replace))
		}
	}
	return s
}

// countReader counts (and optionally hashes) the bytes read through it
// and notes whether its source ended cleanly.
type countReader struct {
	src  io.ReadCloser
	n    atomic.Int64
	h    hash.Hash
	done atomic.Bool
}

func newCountReader(src io.ReadCloser, hashed bool) *countReader {
	c := &countReader{src: src}
	if hashed {
		c.h = sha256.New()
	}
	return c
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.src.Read(p)
	if n > 0 {
		c.n.Add(int64(n))
		if c.h != nil {
			c.h.Write(p[:n])
		}
	}
	if err == io.EOF {
		c.done.Store(true)
	}
	return n, err
}

func (c *countReader) Close() error { return c.src.Close() }
