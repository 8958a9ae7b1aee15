package bench

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// TestDensityHTTPReusesItsConnections: density's client, driven by
// densityClients workers as its creates and execs are, opens at most
// densityClients connections in all, however many requests it sends: its
// descriptors are the daemon's too.
func TestDensityHTTPReusesItsConnections(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	hc := densityHTTP()
	defer hc.CloseIdleConnections()
	var wg sync.WaitGroup
	for range 2 * densityClients {
		wg.Go(func() {
			for range 50 {
				resp, err := hc.Get(srv.URL)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	if n := conns.Load(); n > densityClients {
		t.Errorf("%d connections for %d requests, want at most %d", n, 2*densityClients*50, densityClients)
	}
}
