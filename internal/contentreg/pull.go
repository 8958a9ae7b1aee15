package contentreg

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// maxManifestBytes bounds the manifest a pull reads.
const maxManifestBytes = 4 << 20

// PullTree fetches repo@digest, checks the manifest and every blob against
// their digests (other bytes are an error wrapping ErrDigestMismatch), and
// unpacks the tree into dir, which must not exist: the tree is written
// beside it in its parent and renamed into place, so that a failure leaves
// nothing. It returns the image's meta bytes.
func (r *Registry) PullTree(ctx context.Context, repo, digest, dir string) (meta []byte, err error) {
	rp, err := r.repository(repo)
	if err != nil {
		return nil, err
	}
	want, err := v1.NewHash(digest)
	if err != nil || want.Algorithm != "sha256" {
		return nil, fmt.Errorf("digest %q: want sha256:<64 hex digits>: %w", digest, ErrInvalid)
	}
	if _, err := os.Lstat(dir); err == nil {
		return nil, fmt.Errorf("pulling into %s: %w", dir, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("pulling into %s: %w", dir, err)
	}
	start := time.Now()
	rt, err := transport.NewWithContext(ctx, rp.Registry, r.auth, r.rt, []string{rp.Scope(transport.PullScope)})
	if err != nil {
		return nil, fmt.Errorf("reaching the content registry %s: %w", r.URL(), err)
	}
	c := &blobClient{client: &http.Client{Transport: rt}, repo: rp}

	m, err := c.manifest(ctx, want)
	if err != nil {
		return nil, err
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != LayerMediaType || m.Config.MediaType != MetaMediaType {
		return nil, fmt.Errorf("%s@%s is not a tree pushed by fence: %w", rp.Name(), want, ErrInvalid)
	}
	if m.Config.Size > maxMetaBytes {
		return nil, fmt.Errorf("%s@%s: meta of %d bytes is over the limit: %w", rp.Name(), want, m.Config.Size, ErrInvalid)
	}
	meta, err = c.readBlob(ctx, m.Config)
	if err != nil {
		return nil, err
	}

	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".pull-")
	if err != nil {
		return nil, fmt.Errorf("pulling into %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := c.unpackBlob(ctx, m.Layers[0], tmp); err != nil {
		return nil, err
	}
	if err := syncFS(tmp); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			err = fmt.Errorf("%w: %w", err, fs.ErrExist)
		}
		return nil, fmt.Errorf("pulling into %s: %w", dir, err)
	}
	r.log.Info("content registry: pulled", "repo", rp.Name(), "digest", want.String(),
		"layer_bytes", m.Layers[0].Size, "took", time.Since(start).Round(time.Millisecond))
	return meta, nil
}

// blobClient reads one repository's manifests and blobs.
type blobClient struct {
	client *http.Client
	repo   name.Repository
}

// get GETs /v2/<repo>/<kind>/<digest>.
func (c *blobClient) get(ctx context.Context, kind string, d v1.Hash, accept string) (*http.Response, error) {
	u := fmt.Sprintf("%s://%s/v2/%s/%s/%s", c.repo.Registry.Scheme(), c.repo.RegistryStr(), c.repo.RepositoryStr(), kind, d)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetching %s@%s: %w", c.repo.Name(), d, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		err := fmt.Errorf("fetching %s@%s: the registry answered %s", c.repo.Name(), d, resp.Status)
		if resp.StatusCode == http.StatusNotFound {
			err = fmt.Errorf("%w: %w", err, api.ErrNotFound)
		}
		return nil, err
	}
	return resp, nil
}

// manifest fetches and checks the manifest named by d.
func (c *blobClient) manifest(ctx context.Context, d v1.Hash) (*v1.Manifest, error) {
	resp, err := c.get(ctx, "manifests", d, string(types.OCIManifestSchema1))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("fetching %s@%s: %w", c.repo.Name(), d, err)
	}
	if len(b) > maxManifestBytes {
		return nil, fmt.Errorf("manifest of %s@%s is over %d bytes: %w", c.repo.Name(), d, maxManifestBytes, ErrInvalid)
	}
	if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != d.Hex {
		return nil, fmt.Errorf("manifest of %s@%s: the registry served bytes of sha256:%x: %w", c.repo.Name(), d, got, ErrDigestMismatch)
	}
	var m v1.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest of %s@%s: %w: %w", c.repo.Name(), d, err, ErrInvalid)
	}
	return &m, nil
}

// readBlob fetches and checks a small blob.
func (c *blobClient) readBlob(ctx context.Context, desc v1.Descriptor) ([]byte, error) {
	resp, err := c.get(ctx, "blobs", desc.Digest, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	v := newVerifier(resp.Body, desc)
	b, err := io.ReadAll(v)
	if err != nil {
		return nil, fmt.Errorf("fetching %s@%s: %w", c.repo.Name(), desc.Digest, err)
	}
	if err := v.check(c.repo); err != nil {
		return nil, err
	}
	return b, nil
}

// unpackBlob streams the layer desc into dir, checking its digest.
func (c *blobClient) unpackBlob(ctx context.Context, desc v1.Descriptor, dir string) error {
	resp, err := c.get(ctx, "blobs", desc.Digest, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	v := newVerifier(resp.Body, desc)
	uerr := unpackGzip(ctx, v, dir)
	// Whatever the unpacking made of them, bytes that are not the blob
	// are reported as such.
	if _, err := io.Copy(io.Discard, v); err != nil && uerr == nil {
		uerr = err
	}
	if err := v.check(c.repo); err != nil {
		return err
	}
	if uerr != nil {
		return fmt.Errorf("unpacking %s@%s: %w", c.repo.Name(), desc.Digest, uerr)
	}
	return nil
}

// unpackGzip restores the gzip tar r into dir, reading r to its end.
func unpackGzip(ctx context.Context, r io.Reader, dir string) error {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	if err := readTree(ctx, gz, dir); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, gz); err != nil { // the gzip trailer's check
		return err
	}
	return gz.Close()
}

// verifier hashes what is read through it, up to one byte past the size
// the descriptor gives.
type verifier struct {
	r    io.Reader
	h    hash.Hash
	n    int64
	desc v1.Descriptor
}

func newVerifier(r io.Reader, desc v1.Descriptor) *verifier {
	return &verifier{r: io.LimitReader(r, desc.Size+1), h: sha256.New(), desc: desc}
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	return n, err
}

// check compares what was read with the descriptor.
func (v *verifier) check(repo name.Repository) error {
	got := hex.EncodeToString(v.h.Sum(nil))
	if v.n != v.desc.Size || !strings.EqualFold(got, v.desc.Digest.Hex) {
		return fmt.Errorf("blob %s@%s: the registry served %d bytes of sha256:%s (want %d bytes): %w",
			repo.Name(), v.desc.Digest, v.n, got, v.desc.Size, ErrDigestMismatch)
	}
	return nil
}

// syncFS flushes the filesystem holding dir, so that the tree is on disk
// before it is renamed into place.
func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}
