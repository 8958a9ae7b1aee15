package sniff

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

var errNotAllowed = errors.New("host not allowed")

// allowOnly allows allowed.test, in any case, with one trailing dot.
func allowOnly(host string) error {
	if strings.EqualFold(strings.TrimSuffix(host, "."), "allowed.test") {
		return nil
	}
	return errNotAllowed
}

// runStream writes in through an HTTPStream in pieces of size step (all
// at once if step is 0) and returns what reached the writer and the error.
func runStream(in string, step int, switched func() bool) (string, error) {
	var out bytes.Buffer
	s := NewHTTPStream(&out, HTTPConfig{Allow: allowOnly, Switched: switched})
	b := []byte(in)
	if step == 0 {
		step = len(b) + 1
	}
	for len(b) > 0 {
		k := min(step, len(b))
		n, err := s.Write(b[:k])
		if err != nil {
			return out.String(), err
		}
		if n != k {
			return out.String(), errors.New("short write without error")
		}
		b = b[k:]
	}
	return out.String(), nil
}

const okGet = "GET /a HTTP/1.1\r\nHost: allowed.test\r\n\r\n"

func TestHTTPStreamAttacks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		wantErr error
		// wantOut is what must have passed before the refusal.
		wantOut string
	}{
		{"pipelined second Host", okGet + "GET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n", errNotAllowed, okGet},
		{"leading CRLF then evil", "\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", errNotAllowed, ""},
		{"bare LF prefix then evil", "\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", errNotAllowed, ""},
		{"PROPFIND evil", "PROPFIND / HTTP/1.1\r\nHost: evil.test\r\n\r\n", errNotAllowed, ""},
		{"absolute-form other authority", "GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", ErrMalformed, ""},
		{"absolute-form evil both", "GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n", errNotAllowed, ""},
		{"absolute-form userinfo", "GET http://allowed.test@evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n", ErrMalformed, ""},
		{"absolute-form other scheme", "GET ftp://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", ErrMalformed, ""},
		{"duplicate Host", "GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\n\r\n", ErrNoHost, ""},
		{"duplicate Host same", "GET / HTTP/1.1\r\nHost: allowed.test\r\nhost: allowed.test\r\n\r\n", ErrNoHost, ""},
		{"no Host 1.0", "GET / HTTP/1.0\r\n\r\n", ErrNoHost, ""},
		{"empty Host", "GET / HTTP/1.1\r\nHost:\r\n\r\n", ErrMalformed, ""},
		{"Host with bad port", "GET / HTTP/1.1\r\nHost: allowed.test:evil\r\n\r\n", ErrMalformed, ""},
		{"Host with userinfo", "GET / HTTP/1.1\r\nHost: x@evil.test\r\n\r\n", ErrMalformed, ""},
		{"space before colon", "GET / HTTP/1.1\r\nHost : evil.test\r\nHost: allowed.test\r\n\r\n", ErrMalformed, ""},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: allowed.test\r\nX: a\r\n b\r\n\r\n", ErrMalformed, ""},
		{"bare LF in head", "GET / HTTP/1.1\r\nX: a\nHost: evil.test\r\nHost: allowed.test\r\n\r\n", ErrMalformed, ""},
		{"bare CR in head", "GET / HTTP/1.1\r\nX: a\rHost: evil.test\r\nHost: allowed.test\r\n\r\n", ErrMalformed, ""},
		{"NUL in value", "GET / HTTP/1.1\r\nHost: allowed.test\r\nX: a\x00b\r\n\r\n", ErrMalformed, ""},
		{"CL and TE", "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", ErrMalformed, ""},
		{"differing CL", "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 0\r\nContent-Length: 40\r\n\r\n", ErrMalformed, ""},
		{"CL list", "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 1, 1\r\n\r\nx", ErrMalformed, ""},
		{"CL sign", "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: +1\r\n\r\nx", ErrMalformed, ""},
		{"TE not chunked", "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: gzip\r\n\r\n", ErrMalformed, ""},
		{"TE chunked then identity", "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked, identity\r\n\r\n", ErrMalformed, ""},
		{"two TE", "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", ErrMalformed, ""},
		{"TE in 1.0", "POST / HTTP/1.0\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n", ErrMalformed, ""},
		{"chunked hides second request",
			"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n",
			errNotAllowed, "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
		{"chunk size prefix", "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", ErrMalformed, "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{"chunk size space", "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n", ErrMalformed, "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{"chunk data overrun", "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nhello\r\n0\r\n\r\n", ErrMalformed, "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nh"},
		{"chunk size bare LF", "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n", ErrMalformed, "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{"chunk size huge", "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n", ErrMalformed, "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{"trailer obs-fold", "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: a\r\n b\r\n\r\n", ErrMalformed, "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"},
		{"h2 prior knowledge", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", ErrHTTP2, ""},
		{"h2c upgrade", "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n", ErrHTTP2, ""},
		{"h2c among others", "GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket, h2c\r\n\r\n", ErrHTTP2, ""},
		{"other upgrade", "GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: TLS/1.0\r\n\r\n", ErrUpgrade, ""},
		{"websocket not first", okGet + "GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\n\r\n", ErrUpgrade, okGet},
		{"CONNECT", "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n", ErrConnect, ""},
		{"CONNECT allowed", "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", ErrConnect, ""},
		{"HTTP/0.9", "GET /\r\n\r\n", ErrNotHTTP, ""},
		{"HTTP/1.2", "GET / HTTP/1.2\r\nHost: allowed.test\r\n\r\n", ErrNotHTTP, ""},
		{"lower-case version", "GET / http/1.1\r\nHost: allowed.test\r\n\r\n", ErrNotHTTP, ""},
		{"double space", "GET  / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", ErrNotHTTP, ""},
		{"tab separator", "GET\t/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", ErrNotHTTP, ""},
		{"not HTTP", "SSH-2.0-x\r\n\r\n", ErrNotHTTP, ""},
		{"star not OPTIONS", "GET * HTTP/1.1\r\nHost: allowed.test\r\n\r\n", ErrMalformed, ""},
		{"oversized head", "GET / HTTP/1.1\r\nHost: allowed.test\r\nX: " + strings.Repeat("a", MaxHTTPHead) + "\r\n\r\n", ErrHeadLimit, ""},
		{"oversized head, no end", "GET / HTTP/1.1\r\nHost: allowed.test\r\nX: " + strings.Repeat("a", 2*MaxHTTPHead), ErrHeadLimit, ""},
	} {
		for _, step := range []int{0, 1, 7, 4096} {
			out, err := runStream(tc.in, step, nil)
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("%s (step %d): err = %v, want %v", tc.name, step, err, tc.wantErr)
			}
			if out != tc.wantOut {
				t.Errorf("%s (step %d): passed %q, want %q", tc.name, step, out, tc.wantOut)
			}
		}
	}
}

func TestHTTPStreamAllowed(t *testing.T) {
	chunked := "POST /c HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"5;name=v\r\nhello\r\n1A\r\n" + strings.Repeat("z", 26) + "\r\n0\r\nX-Sum: 1\r\n\r\n"
	for _, tc := range []struct {
		name, in, want string
	}{
		{"keep-alive", okGet + "GET /b HTTP/1.1\r\nHost: ALLOWED.TEST.\r\n\r\n" + "GET /c HTTP/1.1\r\nHost: allowed.test:80\r\n\r\n",
			okGet + "GET /b HTTP/1.1\r\nHost: ALLOWED.TEST.\r\n\r\n" + "GET /c HTTP/1.1\r\nHost: allowed.test:80\r\n\r\n"},
		{"leading CRLF dropped", "\r\n" + okGet, okGet},
		{"CRLF between requests dropped", okGet + "\r\n" + okGet, okGet + okGet},
		{"PROPFIND", "PROPFIND /d HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "PROPFIND /d HTTP/1.1\r\nHost: allowed.test\r\n\r\n"},
		{"absolute-form", "GET http://Allowed.Test:80/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "GET http://Allowed.Test:80/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n"},
		{"OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "OPTIONS * HTTP/1.1\r\nHost: allowed.test\r\n\r\n"},
		{"Content-Length body then request", "POST /p HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 40\r\n\r\nGET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n\r\n\r\n" + okGet,
			"POST /p HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 40\r\n\r\nGET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n\r\n\r\n" + okGet},
		{"same CL twice", "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
			"POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx"},
		{"chunked with trailer", chunked + okGet, chunked + okGet},
		{"HTTP/1.0", "GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n", "GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n"},
	} {
		for _, step := range []int{0, 1, 3, 64} {
			out, err := runStream(tc.in, step, nil)
			if err != nil || out != tc.want {
				t.Errorf("%s (step %d): passed %q, %v; want %q, nil", tc.name, step, out, err, tc.want)
			}
		}
	}
}

func TestHTTPStreamWebSocket(t *testing.T) {
	up := "GET /ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
	frames := "\x81\x85anything goes after a 101\r\nHost: evil.test\r\n\r\n"
	if _, err := runStream(up, 0, nil); !errors.Is(err, ErrUpgrade) {
		t.Errorf("upgrade without Switched: %v, want ErrUpgrade", err)
	}
	calls := 0
	out, err := runStream(up+frames, 5, func() bool { calls++; return true })
	if err != nil || out != up+frames || calls != 1 {
		t.Errorf("after 101: passed %q, %v (Switched called %d times); want everything", out, err, calls)
	}
	// The server did not switch: the next bytes are a request again.
	out, err = runStream(up+"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", 0, func() bool { return false })
	if !errors.Is(err, errNotAllowed) || out != up {
		t.Errorf("no 101: passed %q, %v; want the upgrade request only, errNotAllowed", out, err)
	}
	if _, err := runStream("GET /ws HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nContent-Length: 3\r\n\r\nabc", 0, func() bool { return true }); !errors.Is(err, ErrUpgrade) {
		t.Errorf("upgrade with a body: %v, want ErrUpgrade", err)
	}
}

func TestLooksHTTP(t *testing.T) {
	for in, want := range map[string][2]bool{
		"GET / HTTP/1.1": {true, false}, "PROPFIND ": {true, false}, "\r\n\r\nGET ": {true, false},
		"GE": {false, true}, "\r\n": {false, true}, "SSH-2.0-x\r\n": {false, false},
		"\x16\x03\x01": {false, false}, " GET": {false, false},
	} {
		if ok, more := LooksHTTP([]byte(in)); ok != want[0] || more != want[1] {
			t.Errorf("LooksHTTP(%q) = %v, %v; want %v, %v", in, ok, more, want[0], want[1])
		}
	}
}

// FuzzHTTPStream checks, with Go's own request parser as an independent
// reader, that whatever an HTTPStream lets through parses as requests
// whose every Host is allowed.test, and that how the input is split into
// writes changes nothing.
func FuzzHTTPStream(f *testing.F) {
	for _, s := range []string{
		okGet + "GET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + okGet,
		"POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\n\r\nhello" + okGet,
		"\r\nGET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, in []byte, step uint8) {
		whole, errWhole := runStream(string(in), 0, nil)
		split, errSplit := runStream(string(in), int(step%64)+1, nil)
		if whole != split || (errWhole == nil) != (errSplit == nil) {
			t.Fatalf("split changes the result: %q/%v vs %q/%v", whole, errWhole, split, errSplit)
		}
		br := bufio.NewReader(strings.NewReader(whole))
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				break
			}
			if err := allowOnly(strings.TrimSuffix(hostNoPort(req.Host), ".")); err != nil {
				t.Fatalf("a request to %q passed: %q", req.Host, whole)
			}
			if _, err := io.Copy(io.Discard, req.Body); err != nil {
				break
			}
		}
	})
}

func hostNoPort(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.Contains(h[i:], "]") {
		return h[:i]
	}
	return h
}

// BenchmarkHTTPStreamBody measures a Content-Length body through the
// checker in 64 KiB writes.
func BenchmarkHTTPStreamBody(b *testing.B) {
	s := NewHTTPStream(io.Discard, HTTPConfig{Allow: allowOnly})
	if _, err := s.Write([]byte("POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 999999999999999\r\n\r\n")); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for range b.N {
		if _, err := s.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHTTPStreamRequests measures pipelined small requests (a
// typical browser-like head) through the checker.
func BenchmarkHTTPStreamRequests(b *testing.B) {
	req := []byte("GET /simple/pip/ HTTP/1.1\r\nHost: allowed.test\r\nUser-Agent: pip/24.0\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n\r\n")
	s := NewHTTPStream(io.Discard, HTTPConfig{Allow: allowOnly})
	b.SetBytes(int64(len(req)))
	b.ReportAllocs()
	for range b.N {
		if _, err := s.Write(req); err != nil {
			b.Fatal(err)
		}
	}
}
