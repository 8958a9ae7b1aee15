package httpserve

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
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

// A request that never ends does not hold Shutdown past its grace: its
// connection is closed, which ends the handler (its context is done) and
// the client's wait.
func TestShutdownClosesStuckConnections(t *testing.T) {
	started, ended := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
		close(ended)
	})
	srv, err := New(Options{Handler: h, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	go Serve(ctx, srv, ln)
	resp, err := http.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	cancel()
	if err := Shutdown(t.Context(), srv, 10*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown with a stuck request = %v, want the grace's deadline", err)
	}
	select {
	case <-ended:
	case <-time.After(time.Minute):
		t.Fatal("the stuck request's handler still runs after Shutdown")
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Error("the client's response ended cleanly, want its connection closed")
	}
}
