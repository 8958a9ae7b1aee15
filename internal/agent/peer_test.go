package agent

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"testing"

	"github.com/fencesandbox/fence/internal/agent/boot"
)

// A listener restricted to one peer serves that peer and resets every
// other connection before a request is read; it goes on serving after.
func TestOnlyFromServesThePeerAlone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h, closeH := NewHandler(Options{Config: boot.Config{DefaultUser: "root", DefaultWorkdir: "/"}})
	defer closeH()
	srv := &http.Server{Handler: h}
	go srv.Serve(OnlyFrom(ln, netip.MustParseAddr("127.0.0.2")))
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/health"

	get := func(from string) (int, error) {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
		resp, err := c.Get(url)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for range 3 { // refusals do not stop the server
		if code, err := get("127.0.0.1"); err == nil {
			t.Fatalf("GET /health from 127.0.0.1 = %d; want the connection refused", code)
		}
		if code, err := get("127.0.0.2"); err != nil || code != http.StatusNoContent {
			t.Fatalf("GET /health from the peer = %d, %v; want 204", code, err)
		}
	}
}

// Accept returns the listener's own errors.
func TestOnlyFromReturnsListenerErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := OnlyFrom(ln, netip.MustParseAddr("127.0.0.2"))
	l.Close()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept on a closed listener = %v, want net.ErrClosed", err)
	}
}
