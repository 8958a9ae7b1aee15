// Package ocitest builds container images in tests and serves them from an
// in-process registry (go-containerregistry's pkg/registry) on the
// loopback address. Only tests import it.
package ocitest

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one tar entry of a test layer. Body is the content of a
// regular file.
type Entry struct {
	Hdr  tar.Header
	Body string
}

// ModTime is the modification time of test entries.
var ModTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// Dir, File, Symlink and Link make entries owned by root.
func Dir(name string, mode int64) Entry {
	return Entry{Hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: ModTime}}
}

func File(name string, mode int64, body string) Entry {
	return Entry{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: ModTime}, Body: body}
}

func Symlink(name, target string) Entry {
	return Entry{Hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: ModTime}}
}

func Link(name, target string) Entry {
	return Entry{Hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o644, ModTime: ModTime}}
}

// Tar returns the tar stream of entries.
func Tar(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Hdr
		if h.Format == tar.FormatUnknown && len(h.PAXRecords) > 0 {
			h.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %s: %v", h.Name, err)
		}
		if e.Body != "" {
			if _, err := io.WriteString(tw, e.Body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Layer is a gzip-compressed layer of entries.
func Layer(t testing.TB, entries ...Entry) v1.Layer {
	t.Helper()
	b := Tar(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image stacks layers (bottom first) with the given configuration.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config = cfg
	cf.OS, cf.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// Registry is an in-process registry on 127.0.0.1 that counts the blob
// downloads it serves.
type Registry struct {
	Host string // 127.0.0.1:port
	srv  *httptest.Server

	mu        sync.Mutex
	blobGets  map[string]int
	Authorize func(w http.ResponseWriter, r *http.Request) bool
}

// NewRegistry starts a registry, closed when the test ends.
func NewRegistry(t testing.TB) *Registry {
	r := &Registry{blobGets: map[string]int{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.Authorize != nil && !r.Authorize(w, req) {
			return
		}
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/") {
			r.mu.Lock()
			r.blobGets[req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]]++
			r.mu.Unlock()
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	r.Host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

// URL is the registry's base URL.
func (r *Registry) URL() string { return r.srv.URL }

// Push uploads img as repo:tag and returns the reference.
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.Host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	auth := r.Authorize
	r.Authorize = nil
	defer func() { r.Authorize = auth }()
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	return ref.String()
}

// BlobGets returns how many times the blob with digest d was downloaded.
func (r *Registry) BlobGets(d v1.Hash) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobGets[d.String()]
}
