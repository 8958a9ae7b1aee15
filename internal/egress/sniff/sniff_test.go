package sniff

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"
)

// clientHello returns the bytes a crypto/tls client sends first.
func clientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	go func() {
		cl := tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == ""})
		cl.SetDeadline(time.Now().Add(5 * time.Second))
		cl.Handshake() // fails when s closes
		c.Close()
	}()
	buf := make([]byte, 64<<10)
	var out []byte
	for {
		n, err := s.Read(buf)
		out = append(out, buf[:n]...)
		if _, err2 := ServerName(out); !errors.Is(err2, ErrNeedMore) || err != nil {
			return out
		}
	}
}

// fragment re-frames a single-record ClientHello into records of at most
// size bytes of handshake data each.
func fragment(rec []byte, size int) []byte {
	payload := rec[5:]
	var out []byte
	for len(payload) > 0 {
		n := min(size, len(payload))
		out = append(out, 0x16, 3, 1, byte(n>>8), byte(n))
		out = append(out, payload[:n]...)
		payload = payload[n:]
	}
	return out
}

func TestServerName(t *testing.T) {
	for _, name := range []string{"allowed.test", "a.b.example.com", ""} {
		ch := clientHello(t, name)
		got, err := Sniff(ch)
		if err != nil || got.Kind != TLS || got.Name != name {
			t.Errorf("Sniff(ClientHello(%q)) = %+v, %v, want TLS %q", name, got, err, name)
		}
		frag := fragment(ch, 100)
		if got, err := ServerName(frag); err != nil || got != name {
			t.Errorf("ServerName(fragmented ClientHello(%q)) = %q, %v, want %q", name, got, err, name)
		}
		for i := 0; i < len(ch); i += 7 {
			if _, err := ServerName(ch[:i]); !errors.Is(err, ErrNeedMore) {
				t.Fatalf("ServerName(ClientHello(%q)[:%d]) error = %v, want ErrNeedMore", name, i, err)
			}
		}
	}
}

func TestServerNameMalformed(t *testing.T) {
	ch := clientHello(t, "allowed.test")
	bad := [][]byte{
		{0x16, 3, 1, 0, 0},                  // empty record
		{0x16, 2, 1, 0, 4, 1, 0, 0, 0},      // SSLv2-ish version
		{0x16, 3, 1, 0, 4, 2, 0, 0, 0},      // ServerHello
		append([]byte{}, ch[:len(ch)-1]...), // handled as need-more, see below
	}
	for _, b := range bad[:3] {
		if _, err := ServerName(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("ServerName(%x) error = %v, want ErrMalformed", b, err)
		}
	}
	// A ClientHello whose inner length exceeds the record but records end.
	corrupt := bytes.Clone(ch)
	corrupt[5+4+2+32] = 0xff // session id length past the end
	if _, err := ServerName(corrupt); !errors.Is(err, ErrMalformed) {
		t.Errorf("ServerName(corrupt session id) error = %v, want ErrMalformed", err)
	}
}

func TestHTTPHost(t *testing.T) {
	tests := []struct {
		in   string
		want string
		err  error
	}{
		{"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "allowed.test", nil},
		{"GET / HTTP/1.1\r\nhost:  Allowed.Test:8080 \r\nAccept: */*\r\n\r\n", "Allowed.Test", nil},
		{"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n", "2001:db8::1", nil},
		{"GET / HTTP/1.0\r\n\r\n", "", nil},
		{"GET http://allowed.test/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "allowed.test", nil},
		{"GET http://evil.test/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "", ErrMalformed},
		{"GET http://allowed.test@evil.test/ HTTP/1.1\r\n\r\n", "", ErrMalformed},
		{"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", "allowed.test", nil},
		{"GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\n\r\n", "", ErrMalformed},
		{"GET / HTTP/1.1\r\nHost: allowed.test@evil.test\r\n\r\n", "", ErrMalformed},
		{"GET / HTTP/1.1\r\nHost: allowed%2etest\r\n\r\n", "", ErrMalformed},
		{"GET / HTTP/1.1\r\nX: y\r\n Host: evil.test\r\n\r\n", "", ErrMalformed},
		{"GET / HTTP/1.1\r\nHost : evil.test\r\n\r\n", "", ErrMalformed},
		{"GET / HTTP/1.1\r\nHost: allowed.test\r\n", "", ErrNeedMore},
		{"GE", "", ErrNeedMore},
		{"GET / HTTP/2.0\r\n\r\n", "", ErrMalformed},
	}
	for _, tt := range tests {
		got, err := Sniff([]byte(tt.in))
		if !errors.Is(err, tt.err) || (err == nil && (got.Name != tt.want || got.Kind != HTTP)) {
			t.Errorf("Sniff(%q) = %+v, %v, want %q, %v", tt.in, got, err, tt.want, tt.err)
		}
	}
	for _, in := range []string{"SSH-2.0-OpenSSH_9.2\r\n", "\x00\x01", "PRI * HTTP/2.0\r\n"} {
		if got, err := Sniff([]byte(in)); err != nil || got.Kind != Unknown {
			t.Errorf("Sniff(%q) = %+v, %v, want Unknown", in, got, err)
		}
	}
}

func FuzzSniff(f *testing.F) {
	f.Add(clientHello(f, "allowed.test"))
	f.Add(fragment(clientHello(f, "x.test"), 50))
	f.Add([]byte("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"))
	f.Add([]byte("CONNECT [::1]:443 HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Sniff(b)
		if err != nil && r.Name != "" && !errors.Is(err, ErrNeedMore) {
			t.Fatalf("Sniff(%q) = %+v with error %v", b, r, err)
		}
		if r.Kind == TLS && err == nil {
			// Appending bytes after a complete ClientHello must not change it.
			r2, err2 := Sniff(append(bytes.Clone(b), 0x17, 3, 3, 0, 1, 0))
			if err2 != nil || r2 != r {
				t.Fatalf("Sniff(%q + trailing) = %+v, %v, want %+v", b, r2, err2, r)
			}
		}
	})
}
