package egress

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"

	"golang.org/x/time/rate"

	"github.com/fencesandbox/fence/internal/egress/sniff"
)

// Reasons for refusing a flow whose client stream is checked request by
// request (see the package doc).
const (
	ReasonNotHTTP = "not-tls-or-http" // a name-admitted flow whose client spoke first with neither TLS nor HTTP/1.x
	ReasonHTTP2   = "http2-plain"     // HTTP/2 prior knowledge or an h2c upgrade on a checked plain flow
	ReasonConnect = "http-connect"    // CONNECT on a checked plain flow
	ReasonUpgrade = "http-upgrade"    // an upgrade other than WebSocket on the first request
)

// errRefused is returned by a checked flow's Allow when the policy refused
// a request's Host; the event already holds the decision.
var errRefused = errors.New("egress: request refused by policy")

// httpReason maps an HTTPStream error to the event's reason.
func httpReason(err error) string {
	switch {
	case errors.Is(err, sniff.ErrHTTP2):
		return ReasonHTTP2
	case errors.Is(err, sniff.ErrConnect):
		return ReasonConnect
	case errors.Is(err, sniff.ErrUpgrade):
		return ReasonUpgrade
	case errors.Is(err, sniff.ErrNoHost):
		return ReasonNoName
	case errors.Is(err, sniff.ErrNotHTTP):
		return ReasonNotHTTP
	}
	return ReasonSniff
}

// classify tells what the start of a client stream is. With loose set
// (a name-admitted flow whose client spoke first, where anything but TLS
// and HTTP is refused anyway), a stream that starts like an HTTP request
// line (a token and a space) is HTTP. Otherwise (after a server-first
// banner, or on a flow admitted by address that is peeked only for deny
// name rules) only a first line that mentions an HTTP version is, so that
// "EHLO host" or "PING x" stay opaque.
func classify(b []byte, loose bool) (sniff.Result, error) {
	if len(b) == 0 {
		return sniff.Result{}, sniff.ErrNeedMore
	}
	if b[0] == 0x16 {
		return sniff.Sniff(b)
	}
	ok, more := sniff.LooksHTTP(b)
	switch {
	case more:
		return sniff.Result{}, sniff.ErrNeedMore
	case !ok:
		return sniff.Result{}, nil
	case !loose:
		line, _, found := bytes.Cut(bytes.TrimLeft(b, "\r\n"), []byte("\n"))
		if !found {
			return sniff.Result{}, sniff.ErrNeedMore
		}
		if !bytes.Contains(bytes.ToUpper(line), []byte("HTTP/")) {
			return sniff.Result{}, nil
		}
	}
	return sniff.Result{Kind: sniff.HTTP}, nil
}

// firstBytes remembers the first bytes read from the upstream, so that a
// checked flow can tell whether the answer to a WebSocket upgrade request
// switched protocols. Read runs on one goroutine; ready is closed once the
// status line's start is known or the stream ended.
type firstBytes struct {
	net.Conn
	buf   [len("HTTP/1.1 101 ")]byte
	n     int
	ready chan struct{}
}

func newFirstBytes(c net.Conn) *firstBytes { return &firstBytes{Conn: c, ready: make(chan struct{})} }

func (f *firstBytes) Read(p []byte) (int, error) {
	n, err := f.Conn.Read(p)
	if f.n < len(f.buf) {
		f.n += copy(f.buf[f.n:], p[:n])
		if f.n == len(f.buf) || err != nil {
			f.n = len(f.buf)
			close(f.ready)
		}
	}
	return n, err
}

// switched waits for the upstream's first bytes and reports whether they
// are a 101 status line.
func (f *firstBytes) switched(ctx context.Context) bool {
	select {
	case <-f.ready:
	case <-ctx.Done():
		return false
	}
	s := string(f.buf[:])
	return s == "HTTP/1.1 101 " || s == "HTTP/1.0 101 "
}

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// relayHTTP copies the sandbox's stream (peeked, then the rest of down) to
// up through an HTTPStream, so that every request is checked by allow
// before any byte of it leaves. It returns the bytes written upstream and
// the checker's error (nil when the sandbox closed its side, a copy error
// is reported through copyErr).
func relayHTTP(ctx context.Context, up, down net.Conn, peeked []byte, lim *rate.Limiter,
	cfg sniff.HTTPConfig) (out int64, checkErr, copyErr error) {
	cw := &countWriter{w: up}
	s := sniff.NewHTTPStream(cw, cfg)
	if _, err := s.Write(peeked); err != nil {
		if isWriteErr(err) {
			return cw.n, nil, err
		}
		return cw.n, err, nil
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for {
		nr, rerr := down.Read(buf)
		if nr > 0 && lim != nil {
			if err := waitN(ctx, lim, nr); err != nil {
				return cw.n, nil, err
			}
		}
		if nr > 0 {
			if _, err := s.Write(buf[:nr]); err != nil {
				if isWriteErr(err) {
					return cw.n, nil, err
				}
				return cw.n, err, nil
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				if cwr, ok := up.(closeWriter); ok {
					cwr.CloseWrite()
					return cw.n, nil, nil
				}
			}
			return cw.n, nil, rerr
		}
	}
}

// isWriteErr reports whether err came from writing upstream rather than
// from checking: the checker's own errors are its sentinels or errRefused.
func isWriteErr(err error) bool {
	for _, e := range []error{errRefused, sniff.ErrMalformed, sniff.ErrNotHTTP, sniff.ErrNoHost,
		sniff.ErrHeadLimit, sniff.ErrHTTP2, sniff.ErrConnect, sniff.ErrUpgrade} {
		if errors.Is(err, e) {
			return false
		}
	}
	return true
}

// isIPLiteral reports whether host is an IP address (bracketed or not).
func isIPLiteral(host string) bool {
	_, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil
}
