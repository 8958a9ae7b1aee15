package oci

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/fencesandbox/fence/internal/oci/ocitest"
)

// gzipLayer is a gzip-compressed layer whose uncompressed stream counts
// the bytes the cache reads from it.
type gzipLayer struct {
	v1.Layer // only Uncompressed is called
	gz       []byte
	read     int64
}

func (l *gzipLayer) Uncompressed() (io.ReadCloser, error) {
	zr, err := gzip.NewReader(bytes.NewReader(l.gz))
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{&countReader{r: zr, n: &l.read}, zr}, nil
}

type countReader struct {
	r io.Reader
	n *int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	*c.n += int64(n)
	return n, err
}

// newGzipLayer compresses a tar stream followed by trailer, and returns
// the layer with the diff_id of the whole uncompressed stream.
func newGzipLayer(t *testing.T, tarball []byte, trailer io.Reader) (*gzipLayer, v1.Hash) {
	t.Helper()
	var gz bytes.Buffer
	h := sha256.New()
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	w := io.MultiWriter(zw, h)
	w.Write(tarball)
	if _, err := io.Copy(w, trailer); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return &gzipLayer{gz: gz.Bytes()}, v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
}

// TestLayerTrailer reads layers with bytes after their tar end marker: a
// compressible trailer of data (a gzip bomb whose digest matches) is
// refused after reading no more than the image's size limit; zero
// padding is accepted and counts against the limit.
func TestLayerTrailer(t *testing.T) {
	if os.Geteuid() != 0 {
		// testutil.RequireRoot's rule; testutil imports this package.
		if os.Getenv("CI") == "true" {
			t.Fatal("this test needs root, and CI runs as root: refusing to skip")
		}
		t.Skip("needs root")
	}
	const limit = 4 << 20
	body := ocitest.Tar(t, ocitest.Dir("etc/", 0o755), ocitest.File("etc/ok", 0o644, "ok\n"))
	tests := []struct {
		name    string
		trailer io.Reader
		errHas  string
	}{
		{"bomb", io.LimitReader(repeatReader('A'), 64<<20), "not zero padding"},
		{"bomb after padding", io.MultiReader(bytes.NewReader(make([]byte, 10240)), io.LimitReader(repeatReader('A'), 64<<20)), "not zero padding"},
		{"zero bomb", io.LimitReader(repeatReader(0), 64<<20), "size limit"},
		{"zero padding", bytes.NewReader(make([]byte, 64<<10)), ""},
		{"nothing", strings.NewReader(""), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, id := newGzipLayer(t, body, tt.trailer)
			t.Logf("compressed layer: %d bytes", len(l.gz))
			c, err := NewCache(filepath.Join(t.TempDir(), "layers"))
			if err != nil {
				t.Fatal(err)
			}
			budget := &limits{bytes: limit, files: 100}
			m, err := c.extract(t.Context(), l, id, budget, newProgress(nil), "layer")
			t.Logf("extract: %v; %d uncompressed bytes read", err, l.read)
			if l.read > limit+64<<10 {
				t.Errorf("read %d uncompressed bytes, more than the size limit of %d", l.read, limit)
			}
			if tt.errHas == "" {
				if err != nil || m.Files != 2 {
					t.Errorf("extract = %+v, %v; want the layer's 2 files", m, err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), tt.errHas) {
				t.Errorf("extract = %v, want ErrInvalidImage mentioning %q", err, tt.errHas)
			}
			if _, ok, _ := c.readMeta(id); ok {
				t.Error("the refused layer is in the cache")
			}
		})
	}
}

type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}
