package httpserve

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// A certificate that does not load fails New; without one the server is
// plain HTTP, answers on the listener, and Serve returns nil once its
// context is done.
func TestServe(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	bad := filepath.Join(t.TempDir(), "bad.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Logger: log, TLSCert: bad, TLSKey: bad}); err == nil {
		t.Errorf("New with a bad certificate: no error")
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	srv, err := New(Options{Handler: h, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if Scheme(srv) != "http" {
		t.Errorf("Scheme = %q, want http", Scheme(srv))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, srv, ln) }()
	resp, err := http.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok" {
		t.Errorf("body = %q", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after its context is done: %v", err)
	}
	srv.Close()
}
