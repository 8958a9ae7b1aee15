package api

import (
	"errors"
	"net/http/httptest"
	"testing"
	"time"
)

// FuzzSandboxTarget feeds arbitrary Host headers and routing headers to
// the code that decides whether a request is sandbox traffic: it must
// never panic, and a sandbox target always has a port in range and an ID.
func FuzzSandboxTarget(f *testing.F) {
	for _, s := range []string{"49983-abc.localhost", "8000-x.example.test:443", "api.example.test", "-.localhost", "99999-a.localhost", "1-.localhost", "localhost", ""} {
		f.Add(s, "", "")
	}
	f.Add("127.0.0.1:3000", "abc", "49983")
	f.Add("127.0.0.1", "abc", "x")
	f.Fuzz(func(t *testing.T, host, id, port string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = host
		if id != "" {
			r.Header.Set(HeaderSandboxID, id)
		}
		if port != "" {
			r.Header.Set(HeaderSandboxPort, port)
		}
		gotID, gotPort, ok, err := SandboxTarget(r, "example.test")
		if ok && err == nil && (gotPort < 1 || gotPort > 65535 || gotID == "") {
			t.Errorf("SandboxTarget(host %q, id %q, port %q) = %q, %d", host, id, port, gotID, gotPort)
		}
	})
}

// TestSandboxTarget: the routing headers win over the Host, the Host
// names a sandbox under the domain or localhost, and a bad port header is
// sandbox traffic with an invalid-argument error.
func TestSandboxTarget(t *testing.T) {
	for _, c := range []struct {
		host, id, port string
		wantID         string
		wantPort       int
		wantOK, bad    bool
	}{
		{host: "49983-abc.example.test", wantID: "abc", wantPort: 49983, wantOK: true},
		{host: "8000-ABC.Example.Test:443", wantID: "abc", wantPort: 8000, wantOK: true},
		{host: "3000-x.localhost", wantID: "x", wantPort: 3000, wantOK: true},
		{host: "api.example.test"},
		{host: "3000-x.y.example.test"},
		{host: "70000-x.example.test"},
		{host: "3000-x.other.test"},
		{host: "3000-x.example.test", id: "abc", port: "49983", wantID: "abc", wantPort: 49983, wantOK: true},
		{host: "api.example.test", id: "abc", wantOK: true, bad: true},
		{host: "api.example.test", id: "abc", port: "0", wantOK: true, bad: true},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = c.host
		if c.id != "" {
			r.Header.Set(HeaderSandboxID, c.id)
		}
		if c.port != "" {
			r.Header.Set(HeaderSandboxPort, c.port)
		}
		id, port, ok, err := SandboxTarget(r, "example.test")
		if ok != c.wantOK || (err != nil) != c.bad || err != nil && !errors.Is(err, ErrInvalidArgument) ||
			!c.bad && (id != c.wantID || port != c.wantPort) {
			t.Errorf("SandboxTarget(host %q, id %q, port %q) = %q, %d, %v, %v", c.host, c.id, c.port, id, port, ok, err)
		}
	}
}

// TestPageToken: a token reads back as what it was made from, and
// anything else is an invalid argument.
func TestPageToken(t *testing.T) {
	at := time.Unix(1_700_000_000, 123)
	got, id, err := ParsePageToken(PageToken(at, "abc123"))
	if err != nil || !got.Equal(at) || id != "abc123" {
		t.Fatalf("ParsePageToken(PageToken) = %v, %q, %v", got, id, err)
	}
	for _, tok := range []string{"!!", "", PageToken(at, "ABC"), PageToken(at, "")} {
		if _, _, err := ParsePageToken(tok); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParsePageToken(%q) = %v, want ErrInvalidArgument", tok, err)
		}
	}
}
