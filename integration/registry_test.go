package integration

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
)

// testRegistry is go-containerregistry's in-process registry on loopback,
// with what the tests of content moved through a registry (snapshots and
// templates) turn on and off: corrupt serves every blob with one byte
// changed (the digests it names stay those of the true bytes), refuse
// answers every write with 403, and manifests counts the manifest GETs.
type testRegistry struct {
	URL       string // host:port/prefix, for --registry
	corrupt   atomic.Bool
	refuse    atomic.Bool
	manifests atomic.Int64
}

func startRegistry(t *testing.T) *testRegistry {
	t.Helper()
	r := &testRegistry{}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/manifests/") {
			r.manifests.Add(1)
		}
		if r.refuse.Load() && req.Method != http.MethodGet && req.Method != http.MethodHead {
			http.Error(w, "refusing writes", http.StatusForbidden)
			return
		}
		if !r.corrupt.Load() || req.Method != http.MethodGet || !strings.Contains(req.URL.Path, "/blobs/") {
			inner.ServeHTTP(w, req)
			return
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, req)
		b := rec.Body.Bytes()
		if len(b) > 0 {
			b[len(b)/2] ^= 0x01
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	r.URL = strings.TrimPrefix(srv.URL, "http://") + "/fence"
	return r
}
