package gateway

import (
	"compress/flate"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strings"
)

// maxCodings bounds the content codings the gateway undoes on one
// response; a response that lists more is refused.
const maxCodings = 4

// contentCodings returns the content codings h lists, in the order they
// were applied, over all its Content-Encoding lines, lower-cased and
// without "identity" (which changes nothing). Any coding but gzip,
// x-gzip and deflate, or more than maxCodings of them, is errEncoding.
func contentCodings(h http.Header) ([]string, error) {
	var out []string
	for _, line := range h.Values("Content-Encoding") {
		for _, c := range strings.Split(line, ",") {
			switch c = strings.ToLower(strings.TrimSpace(c)); c {
			case "", "identity":
			case "gzip", "x-gzip", "deflate":
				if len(out) == maxCodings {
					return nil, errEncoding
				}
				out = append(out, c)
			default:
				return nil, errEncoding
			}
		}
	}
	return out, nil
}

// decoded returns resp's body as identity bytes: every content coding it
// lists, on any number of Content-Encoding lines, is undone, last applied
// first, and the header dropped; a response with a coding the gateway
// cannot undo is refused whole (errEncoding), never passed on partly
// decoded.
func decoded(resp *http.Response) (io.ReadCloser, error) {
	codings, err := contentCodings(resp.Header)
	if err != nil {
		return nil, err
	}
	resp.Header.Del("Content-Encoding")
	if len(codings) == 0 {
		return resp.Body, nil
	}
	var r io.Reader = resp.Body
	for i := len(codings) - 1; i >= 0; i-- {
		switch codings[i] {
		case "gzip", "x-gzip":
			zr, err := gzip.NewReader(r)
			if errors.Is(err, io.EOF) {
				// This layer is empty, so is the body: r is at its
				// end and says so.
				return readCloser{r, resp.Body}, nil
			}
			if err != nil {
				return nil, errEncoding
			}
			r = zr
		case "deflate":
			r = flate.NewReader(&zlibSkip{r: r})
		}
	}
	return readCloser{r, resp.Body}, nil
}

type readCloser struct {
	io.Reader
	c io.Closer
}

func (r readCloser) Close() error { return r.c.Close() }

// zlibSkip drops a zlib header (HTTP's "deflate" is zlib; some servers
// send raw deflate, which has no such header) so flate can read both.
type zlibSkip struct {
	r    io.Reader
	head []byte
	done bool
}

func (z *zlibSkip) Read(p []byte) (int, error) {
	if !z.done {
		z.done = true
		var h [2]byte
		n, err := io.ReadFull(z.r, h[:])
		if n < 2 {
			if err == nil || err == io.ErrUnexpectedEOF {
				err = io.EOF
			}
			return copy(p, h[:n]), err
		}
		if h[0]&0x0f == 8 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
			// zlib header; a preset dictionary is not supported by HTTP.
		} else {
			z.head = h[:]
		}
	}
	if len(z.head) > 0 {
		n := copy(p, z.head)
		z.head = z.head[n:]
		return n, nil
	}
	return z.r.Read(p)
}
