package sniff

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"strings"
)

// MaxHTTPHead bounds one request head (request line and header fields) and
// one chunked trailer section on an [HTTPStream]; a longer one is refused.
const MaxHTTPHead = 64 << 10

// maxChunkLine bounds a chunk-size line with its extensions.
const maxChunkLine = 4 << 10

// Errors of an [HTTPStream], besides [ErrMalformed] (broken or ambiguous
// framing: obs-fold, bare CR or LF, control bytes, Content-Length with
// Transfer-Encoding, differing Content-Lengths, any Transfer-Encoding
// but chunked alone, an absolute-form target naming another host than Host).
var (
	ErrNotHTTP   = errors.New("sniff: not an HTTP/1.x request")
	ErrNoHost    = errors.New("sniff: HTTP request without exactly one Host")
	ErrHeadLimit = errors.New("sniff: HTTP request head too large")
	ErrHTTP2     = errors.New("sniff: HTTP/2 (prior knowledge or h2c upgrade)")
	ErrConnect   = errors.New("sniff: HTTP CONNECT")
	ErrUpgrade   = errors.New("sniff: HTTP protocol upgrade other than a first-request WebSocket")
)

// HTTPConfig configures an [HTTPStream].
type HTTPConfig struct {
	// Allow is called with the authority host (without port, as sent) of
	// every request before any byte of it is written; a non-nil error
	// refuses the request and ends the stream with that error.
	Allow func(host string) error
	// Switched is called when the client sends bytes after a WebSocket
	// upgrade request (which must be the first request on the stream). It
	// waits for the server's answer to that request and reports whether
	// the server switched protocols (status 101); if so the rest of the
	// stream is written unparsed, otherwise checking goes on with the next
	// request. Nil refuses upgrade requests.
	Switched func() bool
}

type httpState uint8

const (
	hsStart     httpState = iota // between requests: skip CR/LF
	hsHead                       // collecting a request head
	hsBody                       // Content-Length body
	hsChunkSize                  // collecting a chunk-size line
	hsChunkData                  // chunk data
	hsChunkEnd                   // the CRLF after chunk data
	hsTrailer                    // collecting the trailer section
	hsUpgrade                    // after a WebSocket upgrade request
	hsOpaque                     // after a 101: pass everything through
	hsFailed
)

// HTTPStream checks a client's byte stream request by request as it is
// written, and writes to the underlying writer only what it has checked:
// whole request heads whose Host is allowed, and bodies framed by
// Content-Length or chunked encoding. It follows HTTP/1.1 keep-alive and
// pipelining, skips blank lines between requests (as servers do) without
// forwarding them, and refuses anything a server could read differently
// (see the errors). After the first error every Write fails.
//
// Per-stream memory is bounded by [MaxHTTPHead]; bodies pass through in
// the caller's chunks, without copying.
type HTTPStream struct {
	w      io.Writer
	cfg    HTTPConfig
	st     httpState
	buf    []byte // partial head, chunk line, chunk end or trailers
	remain int64  // bytes left of a body or chunk
	reqs   int    // requests checked
	err    error
}

// NewHTTPStream returns a stream that writes checked bytes to w.
func NewHTTPStream(w io.Writer, cfg HTTPConfig) *HTTPStream {
	return &HTTPStream{w: w, cfg: cfg}
}

// Requests returns how many request heads have been checked and written.
func (s *HTTPStream) Requests() int { return s.reqs }

// Err returns the error that ended the stream, or nil.
func (s *HTTPStream) Err() error { return s.err }

func (s *HTTPStream) fail(err error) error {
	s.st, s.err, s.buf = hsFailed, err, nil
	return err
}

// Write checks p and writes what may pass. n counts the bytes of p
// consumed (checked and written, or dropped blank lines, or held back as
// part of an incomplete head); on error n is what was consumed before it.
func (s *HTTPStream) Write(p []byte) (n int, err error) {
	for len(p) > 0 {
		var k int
		switch s.st {
		case hsFailed:
			return n, s.err
		case hsOpaque:
			k, err = s.w.Write(p)
			return n + k, err
		case hsUpgrade:
			if s.cfg.Switched != nil && s.cfg.Switched() {
				s.st = hsOpaque
			} else {
				s.st = hsStart
			}
			continue
		case hsStart:
			for k < len(p) && (p[k] == '\r' || p[k] == '\n') {
				k++
			}
			if k < len(p) {
				s.st = hsHead
			}
		case hsHead, hsTrailer:
			k, err = s.block(p)
		case hsBody, hsChunkData:
			m := int(min(s.remain, int64(len(p))))
			k, err = s.w.Write(p[:m])
			s.remain -= int64(k)
			if err == nil && s.remain == 0 {
				if s.st == hsBody {
					s.st = hsStart
				} else {
					s.st = hsChunkEnd
				}
			}
		case hsChunkSize:
			k, err = s.chunkLine(p)
		case hsChunkEnd:
			k, err = s.chunkEnd(p)
		}
		n += k
		p = p[k:]
		if err != nil {
			if s.st != hsFailed {
				s.fail(err)
			}
			return n, err
		}
	}
	return n, nil
}

// collect gathers bytes of p into s.buf (or uses p directly when s.buf is
// empty) until end finds the end of the item, bounded by limit. It
// returns the item when complete and the bytes of p consumed.
func (s *HTTPStream) collect(p []byte, limit int, end func(b []byte, from int) (int, error)) (item []byte, k int, err error) {
	if len(s.buf) == 0 {
		e, err := end(p, 0)
		if err != nil {
			return nil, 0, err
		}
		if e >= 0 {
			if e > limit {
				return nil, 0, ErrHeadLimit
			}
			return p[:e], e, nil
		}
		if len(p) > limit {
			return nil, 0, ErrHeadLimit
		}
		s.buf = append(s.buf, p...)
		return nil, len(p), nil
	}
	old := len(s.buf)
	take := min(len(p), limit+1-old)
	s.buf = append(s.buf, p[:take]...)
	e, err := end(s.buf, old)
	if err != nil {
		return nil, 0, err
	}
	if e < 0 {
		if len(s.buf) > limit {
			return nil, 0, ErrHeadLimit
		}
		return nil, take, nil
	}
	item = s.buf[:e]
	return item, e - old, nil
}

// resetBuf empties s.buf, dropping a large one.
func (s *HTTPStream) resetBuf() {
	if cap(s.buf) > 4<<10 {
		s.buf = nil
	} else {
		s.buf = s.buf[:0]
	}
}

// blockEnd returns the index just past the empty line that ends a header
// block in b (-1 if none yet), looking at line ends from from on. Every
// LF must follow a CR. An empty first line ends the block (empty trailer
// section).
func blockEnd(b []byte, from int) (int, error) {
	for i := from; i < len(b); {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1, nil
		}
		k := i + j
		if k == 0 || b[k-1] != '\r' {
			return -1, ErrMalformed // bare LF
		}
		if k == 1 || (k >= 3 && b[k-3] == '\r' && b[k-2] == '\n') {
			return k + 1, nil
		}
		i = k + 1
	}
	return -1, nil
}

// lineEnd returns the index just past the first CRLF in b, from from on.
func lineEnd(b []byte, from int) (int, error) {
	j := bytes.IndexByte(b[from:], '\n')
	if j < 0 {
		return -1, nil
	}
	k := from + j
	if k == 0 || b[k-1] != '\r' {
		return -1, ErrMalformed
	}
	return k + 1, nil
}

// block handles hsHead and hsTrailer.
func (s *HTTPStream) block(p []byte) (int, error) {
	item, k, err := s.collect(p, MaxHTTPHead, blockEnd)
	if err != nil || item == nil {
		return k, err
	}
	if s.st == hsTrailer {
		if err := checkFields(item); err != nil {
			return k, err
		}
		if _, err := s.w.Write(item); err != nil {
			return k, err
		}
		s.resetBuf()
		s.st = hsStart
		return k, nil
	}
	req, err := ParseRequestHead(item)
	if err != nil {
		return k, err
	}
	if s.cfg.Allow != nil {
		if err := s.cfg.Allow(req.Host); err != nil {
			return k, err
		}
	}
	if req.Upgrade && (s.cfg.Switched == nil || s.reqs > 0 || req.Chunked || req.ContentLength > 0) {
		return k, ErrUpgrade
	}
	if _, err := s.w.Write(item); err != nil {
		return k, err
	}
	s.resetBuf()
	s.reqs++
	switch {
	case req.Chunked:
		s.st = hsChunkSize
	case req.ContentLength > 0:
		s.st, s.remain = hsBody, req.ContentLength
	case req.Upgrade:
		s.st = hsUpgrade
	default:
		s.st = hsStart
	}
	return k, nil
}

// chunkLine handles a chunk-size line: HEXDIG+ [";" ext] CRLF.
func (s *HTTPStream) chunkLine(p []byte) (int, error) {
	line, k, err := s.collect(p, maxChunkLine, lineEnd)
	if err != nil || line == nil {
		return k, err
	}
	body := line[:len(line)-2]
	i := 0
	var size int64
	for ; i < len(body) && unhex(body[i]) >= 0; i++ {
		if i >= 15 {
			return k, ErrMalformed
		}
		size = size<<4 | int64(unhex(body[i]))
	}
	if i == 0 || (i < len(body) && body[i] != ';') || !fieldValueOK(body[i:]) {
		return k, ErrMalformed
	}
	if _, err := s.w.Write(line); err != nil {
		return k, err
	}
	s.resetBuf()
	if size == 0 {
		s.st = hsTrailer
	} else {
		s.st, s.remain = hsChunkData, size
	}
	return k, nil
}

// chunkEnd handles the CRLF after chunk data.
func (s *HTTPStream) chunkEnd(p []byte) (int, error) {
	need := 2 - len(s.buf)
	k := min(need, len(p))
	s.buf = append(s.buf, p[:k]...)
	if !bytes.HasPrefix([]byte("\r\n"), s.buf) {
		return k, ErrMalformed
	}
	if len(s.buf) < 2 {
		return k, nil
	}
	if _, err := s.w.Write(s.buf); err != nil {
		return k, err
	}
	s.resetBuf()
	s.st = hsChunkSize
	return k, nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// Request is what [ParseRequestHead] found in a request head.
type Request struct {
	Method string
	// Host is the authority host without port, as sent.
	Host          string
	ContentLength int64 // 0 when absent
	Chunked       bool
	// Upgrade is set for an Upgrade: websocket request.
	Upgrade bool
}

// ParseRequestHead parses one HTTP/1.0 or HTTP/1.1 request head (request
// line, header fields and the empty line), strictly: whatever a server
// might read in two ways is [ErrMalformed].
func ParseRequestHead(h []byte) (Request, error) {
	var req Request
	if !bytes.HasSuffix(h, []byte("\r\n\r\n")) {
		return req, ErrMalformed
	}
	// Every line of h[:len(h)-2] ends in CRLF.
	line, rest, _ := bytes.Cut(h[:len(h)-2], []byte("\r\n"))
	method, target, version, err := requestLine(line)
	if err != nil {
		return req, err
	}
	req.Method = method
	if method == "PRI" || version == "HTTP/2.0" {
		return req, ErrHTTP2
	}
	if version != "HTTP/1.1" && version != "HTTP/1.0" {
		return req, ErrNotHTTP
	}
	if method == "CONNECT" {
		return req, ErrConnect
	}
	targetHost, err := targetAuthority(method, target)
	if err != nil {
		return req, err
	}
	f, err := readFields(rest, &req)
	if err != nil {
		return req, err
	}
	if f.hosts != 1 || req.Host == "" {
		return req, ErrNoHost
	}
	if targetHost != "" && !sameHost(targetHost, req.Host) {
		return req, ErrMalformed
	}
	if req.ContentLength < 0 {
		req.ContentLength = 0
	}
	if f.tes > 0 {
		if f.tes > 1 || f.cls > 0 || version == "HTTP/1.0" || !strings.EqualFold(f.te, "chunked") {
			return req, ErrMalformed
		}
		req.Chunked = true
	}
	if f.ups > 0 {
		if err := checkUpgrade(f.ups, f.up); err != nil {
			return req, err
		}
		req.Upgrade = true
	}
	return req, nil
}

// headFields counts the fields of a request head that must not repeat,
// and holds the last Transfer-Encoding and Upgrade.
type headFields struct {
	hosts, cls, tes, ups int
	te, up               string
}

// readFields reads the header fields of a request head into req (Host,
// and Content-Length: -1 when there is none) and counts those that must
// not repeat; a Host that is not one and Content-Lengths that disagree
// are malformed.
func readFields(fields []byte, req *Request) (headFields, error) {
	var f headFields
	req.ContentLength = -1
	err := eachField(fields, func(name, value string) error {
		switch strings.ToLower(name) {
		case "host":
			f.hosts++
			h, err := authorityHost(value)
			if err != nil {
				return err
			}
			req.Host = h
		case "content-length":
			f.cls++
			n, ok := parseLength(value)
			if !ok || (req.ContentLength >= 0 && req.ContentLength != n) {
				return ErrMalformed
			}
			req.ContentLength = n
		case "transfer-encoding":
			f.tes++
			f.te = value
		case "upgrade":
			f.ups++
			f.up = value
		}
		return nil
	})
	return f, err
}

// checkUpgrade allows one Upgrade field (n of them) that asks for a
// websocket: h2c would hide the requests after it.
func checkUpgrade(n int, up string) error {
	if n > 1 {
		return ErrMalformed
	}
	for _, p := range strings.Split(up, ",") {
		proto, _, _ := strings.Cut(strings.TrimSpace(p), "/")
		if strings.EqualFold(proto, "h2c") {
			return ErrHTTP2
		}
	}
	if !strings.EqualFold(up, "websocket") {
		return ErrUpgrade
	}
	return nil
}

// requestLine splits "method SP target SP version".
func requestLine(line []byte) (method, target, version string, err error) {
	m, r, ok1 := bytes.Cut(line, []byte(" "))
	t, v, ok2 := bytes.Cut(r, []byte(" "))
	if !ok1 || !ok2 || !isToken(m) || len(t) == 0 {
		return "", "", "", ErrNotHTTP
	}
	for _, c := range t {
		if c <= ' ' || c == 0x7f {
			return "", "", "", ErrNotHTTP
		}
	}
	if len(v) != 8 || !bytes.HasPrefix(v, []byte("HTTP/")) || v[6] != '.' ||
		v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9' {
		return "", "", "", ErrNotHTTP
	}
	return string(m), string(t), string(v), nil
}

// targetAuthority returns the host of an absolute-form target, "" for
// origin-form and OPTIONS *.
func targetAuthority(method, target string) (string, error) {
	switch {
	case target[0] == '/':
		return "", nil
	case target == "*":
		if method != "OPTIONS" {
			return "", ErrMalformed
		}
		return "", nil
	}
	scheme, rest, ok := strings.Cut(target, "://")
	if !ok || !(strings.EqualFold(scheme, "http") || strings.EqualFold(scheme, "https")) {
		return "", ErrMalformed
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	return authorityHost(rest)
}

// authorityHost returns the host of "host[:port]", refusing userinfo, odd
// characters and a port that is not digits.
func authorityHost(a string) (string, error) {
	h, err := hostOnly(a)
	if err != nil {
		return "", err
	}
	port := strings.TrimPrefix(a, h)
	if strings.HasPrefix(a, "[") {
		port = strings.TrimPrefix(a, "["+h+"]")
	}
	if port != "" {
		if port[0] != ':' {
			return "", ErrMalformed
		}
		for _, c := range []byte(port[1:]) {
			if c < '0' || c > '9' {
				return "", ErrMalformed
			}
		}
	}
	return h, nil
}

// eachField calls f for every "name: value" line of block (each line
// ending in CRLF), with the value trimmed of optional whitespace.
func eachField(block []byte, f func(name, value string) error) error {
	for len(block) > 0 {
		line, rest, ok := bytes.Cut(block, []byte("\r\n"))
		if !ok {
			return ErrMalformed
		}
		block = rest
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || !isToken(name) || !fieldValueOK(value) {
			return ErrMalformed // also obs-fold: a line starting with SP/HTAB
		}
		if err := f(string(name), strings.Trim(string(value), " \t")); err != nil {
			return err
		}
	}
	return nil
}

// checkFields validates a trailer section (field lines, then an empty
// line).
func checkFields(block []byte) error {
	return eachField(bytes.TrimSuffix(block, []byte("\r\n")), func(string, string) error { return nil })
}

// fieldValueOK reports whether v has no control bytes but HTAB (so no CR,
// LF or NUL).
func fieldValueOK(v []byte) bool {
	for _, c := range v {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// isToken reports whether b is a non-empty RFC 9110 token.
func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !isTchar(c) {
			return false
		}
	}
	return true
}

func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// parseLength parses a Content-Length value: 1–18 digits.
func parseLength(v string) (int64, bool) {
	if v == "" || len(v) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(v[i]-'0')
	}
	return n, true
}

// sameHost compares two hosts case-insensitively, ignoring one trailing
// dot and IPv6 brackets.
func sameHost(a, b string) bool {
	norm := func(s string) string {
		s = strings.TrimSuffix(s, ".")
		if ip, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
			return ip.String()
		}
		return strings.ToLower(s)
	}
	return norm(a) == norm(b)
}

// LooksHTTP reports whether the start of a client stream could be an
// HTTP/1 request: after optional blank lines, a token and a space. more is
// set when b is too short to tell.
func LooksHTTP(b []byte) (ok, more bool) {
	b = bytes.TrimLeft(b, "\r\n")
	for i, c := range b {
		switch {
		case c == ' ':
			return i > 0, false
		case !isTchar(c):
			return false, false
		}
	}
	return false, true
}
