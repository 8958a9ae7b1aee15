// Package sniff extracts the name a client asks for from the bytes of a
// TCP stream: the server_name (SNI) of a TLS ClientHello, or the
// authority of an HTTP/1 request (absolute-form target or Host header),
// and checks a whole HTTP/1.x client stream request by request
// ([HTTPStream]).
//
// [Sniff] works on a bounded peek buffer and never reads from a
// connection itself: the caller appends bytes and calls it again while it
// returns [ErrNeedMore]. [HTTPStream] is an io.Writer filter: it writes to
// the writer beneath only request heads whose Host its caller allowed and
// the bodies they frame.
//
// # What it guarantees
//
//   - It never panics and never reads past the buffer (fuzzed).
//   - An HTTP request with several Host headers, or whose absolute-form
//     target names another host than its Host header, is an error, never
//     one of the two names.
//   - A ClientHello fragmented over several TLS records is reassembled.
//   - [HTTPStream] passes only what it parsed strictly: every request of a
//     keep-alive or pipelined stream, whatever its method, is checked;
//     framing a server could read differently (Content-Length with
//     Transfer-Encoding, differing lengths, any Transfer-Encoding but chunked alone,
//     obs-fold, bare CR or LF, control bytes) ends the stream, as do
//     CONNECT, HTTP/2 (prior knowledge or h2c) and upgrades other than a
//     first-request WebSocket. What it lets through parses, with net/http's
//     own reader, as requests to allowed hosts only, however the input is
//     split into writes (fuzzed). Memory per stream is bounded by
//     [MaxHTTPHead].
//
// # What it does not do
//
// It does not validate names against policy (the caller's Allow does),
// decrypt anything, or parse HTTP/2 or QUIC: inside TLS only the first
// ClientHello is seen (HTTP/2 coalescing and domain fronting are not
// detected), and after a WebSocket 101 an [HTTPStream] passes bytes
// unparsed. A TLS ClientHello without SNI and a protocol it does not
// recognise both yield an empty name.
package sniff

import (
	"bytes"
	"errors"
	"net"
	"strings"
)

// Kind is the protocol recognised at the start of a stream.
type Kind uint8

// Protocols.
const (
	Unknown Kind = iota
	TLS
	HTTP
)

func (k Kind) String() string {
	switch k {
	case TLS:
		return "tls"
	case HTTP:
		return "http"
	}
	return "unknown"
}

// Errors.
var (
	// ErrNeedMore means the buffer holds a prefix of a recognised message;
	// call again with more bytes.
	ErrNeedMore = errors.New("sniff: need more data")
	// ErrMalformed means the stream looks like TLS or HTTP but is not
	// well-formed, or is ambiguous about the name.
	ErrMalformed = errors.New("sniff: malformed or ambiguous message")
)

// MaxPeek is the buffer size beyond which callers should give up: the
// largest ClientHello fragment set plus an HTTP header block.
const MaxPeek = 16 << 10

// Result is what Sniff found.
type Result struct {
	Kind Kind
	// Name is the SNI or HTTP authority without port, as sent (not
	// normalised); "" if none.
	Name string
}

// Sniff looks at the first bytes of a client stream. It returns
// ErrNeedMore when b is a proper prefix of a TLS ClientHello or HTTP
// request head, ErrMalformed for broken or ambiguous messages, and a
// Result with Kind Unknown for anything else.
func Sniff(b []byte) (Result, error) {
	if len(b) == 0 {
		return Result{}, ErrNeedMore
	}
	if b[0] == 0x16 { // TLS handshake record
		name, err := ServerName(b)
		return Result{Kind: TLS, Name: name}, err
	}
	if looksHTTP(b) {
		name, err := HTTPHost(b)
		return Result{Kind: HTTP, Name: name}, err
	}
	return Result{}, nil
}

var methods = []string{"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "CONNECT ", "OPTIONS ", "TRACE ", "PATCH "}

// looksHTTP reports whether b starts with (a prefix of) an HTTP method.
func looksHTTP(b []byte) bool {
	for _, m := range methods {
		n := min(len(b), len(m))
		if string(b[:n]) == m[:n] {
			return true
		}
	}
	return false
}

// ServerName returns the SNI host name of the TLS ClientHello at the start
// of b ("" if it has none).
func ServerName(b []byte) (string, error) {
	// Reassemble the handshake message from consecutive handshake records.
	var hs []byte
	need := -1
	for {
		if len(b) < 5 {
			return "", ErrNeedMore
		}
		if b[0] != 0x16 || b[1] != 3 {
			return "", ErrMalformed
		}
		n := int(b[3])<<8 | int(b[4])
		if n == 0 || n > 1<<14+2048 {
			return "", ErrMalformed
		}
		if len(b) < 5+n {
			if hs == nil && len(b) > 5 && b[5] != 1 {
				return "", ErrMalformed
			}
			return "", ErrNeedMore
		}
		hs = append(hs, b[5:5+n]...)
		b = b[5+n:]
		if need < 0 && len(hs) >= 4 {
			if hs[0] != 1 {
				return "", ErrMalformed
			}
			need = 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]))
			if need > MaxPeek {
				return "", ErrMalformed
			}
		}
		if need >= 0 && len(hs) >= need {
			return parseClientHello(hs[4:need])
		}
	}
}

type reader struct {
	b  []byte
	ok bool
}

func (r *reader) bytes(n int) []byte {
	if !r.ok || n < 0 || len(r.b) < n {
		r.ok = false
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() int {
	v := r.bytes(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (r *reader) u16() int {
	v := r.bytes(2)
	if v == nil {
		return 0
	}
	return int(v[0])<<8 | int(v[1])
}

func parseClientHello(m []byte) (string, error) {
	r := reader{b: m, ok: true}
	r.bytes(2)       // legacy_version
	r.bytes(32)      // random
	r.bytes(r.u8())  // session id
	r.bytes(r.u16()) // cipher suites
	r.bytes(r.u8())  // compression methods
	if r.ok && len(r.b) == 0 {
		return "", nil // no extensions
	}
	ext := reader{b: r.bytes(r.u16()), ok: r.ok}
	if !r.ok {
		return "", ErrMalformed
	}
	name := ""
	seen := false
	for len(ext.b) > 0 && ext.ok {
		typ := ext.u16()
		data := ext.bytes(ext.u16())
		if !ext.ok {
			break
		}
		if typ != 0 { // server_name
			continue
		}
		if seen {
			return "", ErrMalformed
		}
		seen = true
		sr := reader{b: data, ok: true}
		list := reader{b: sr.bytes(sr.u16()), ok: true}
		if !sr.ok || len(sr.b) != 0 {
			return "", ErrMalformed
		}
		for len(list.b) > 0 && list.ok {
			nt := list.u8()
			v := list.bytes(list.u16())
			if !list.ok {
				break
			}
			if nt == 0 { // host_name
				if name != "" || len(v) == 0 {
					return "", ErrMalformed
				}
				name = string(v)
			}
		}
		if !list.ok {
			return "", ErrMalformed
		}
	}
	if !ext.ok {
		return "", ErrMalformed
	}
	if strings.ContainsAny(name, "\x00/:@ ") {
		return "", ErrMalformed
	}
	return name, nil
}

// HTTPHost returns the authority host (without port) of the HTTP/1
// request head at the start of b.
func HTTPHost(b []byte) (string, error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) >= MaxPeek {
			return "", ErrMalformed
		}
		return "", ErrNeedMore
	}
	head := string(b[:end])
	line, rest, _ := strings.Cut(head, "\r\n")
	parts := strings.Split(line, " ")
	if len(parts) != 3 || !strings.HasPrefix(parts[2], "HTTP/1.") || !looksHTTP([]byte(parts[0]+" ")) {
		return "", ErrMalformed
	}
	method, target := parts[0], parts[1]
	var targetHost string
	switch {
	case method == "CONNECT":
		h, err := hostOnly(target)
		if err != nil {
			return "", err
		}
		targetHost = h
	case strings.HasPrefix(target, "/") || target == "*":
	default:
		// absolute-form: scheme "://" authority [path]
		i := strings.Index(target, "://")
		if i <= 0 {
			return "", ErrMalformed
		}
		auth := target[i+3:]
		if j := strings.IndexAny(auth, "/?#"); j >= 0 {
			auth = auth[:j]
		}
		if strings.Contains(auth, "@") {
			return "", ErrMalformed
		}
		h, err := hostOnly(auth)
		if err != nil {
			return "", err
		}
		targetHost = h
	}
	host, nhost := "", 0
	for rest != "" {
		var l string
		l, rest, _ = strings.Cut(rest, "\r\n")
		if l == "" || l[0] == ' ' || l[0] == '\t' {
			return "", ErrMalformed // obsolete line folding
		}
		k, v, ok := strings.Cut(l, ":")
		if !ok || strings.ContainsAny(k, " \t") {
			return "", ErrMalformed
		}
		if strings.EqualFold(k, "host") {
			nhost++
			h, err := hostOnly(strings.TrimSpace(v))
			if err != nil {
				return "", err
			}
			host = h
		}
	}
	if nhost > 1 {
		return "", ErrMalformed
	}
	if targetHost != "" {
		if nhost == 1 && !strings.EqualFold(strings.TrimSuffix(host, "."), strings.TrimSuffix(targetHost, ".")) {
			return "", ErrMalformed
		}
		return targetHost, nil
	}
	return host, nil
}

// hostOnly strips the port from an authority and rejects userinfo and odd
// characters.
func hostOnly(auth string) (string, error) {
	if auth == "" || strings.ContainsAny(auth, "@/ \t\\%") {
		return "", ErrMalformed
	}
	if strings.HasPrefix(auth, "[") {
		h, _, err := net.SplitHostPort(auth)
		if err != nil {
			if strings.HasSuffix(auth, "]") {
				return auth[1 : len(auth)-1], nil
			}
			return "", ErrMalformed
		}
		return h, nil
	}
	if i := strings.LastIndexByte(auth, ':'); i >= 0 {
		h, _, err := net.SplitHostPort(auth)
		if err != nil || h == "" {
			return "", ErrMalformed
		}
		return h, nil
	}
	return auth, nil
}
