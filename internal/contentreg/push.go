package contentreg

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/stream"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// options are the go-containerregistry options of a request.
func (r *Registry) options(ctx context.Context) []remote.Option {
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuth(r.auth),
		remote.WithTransport(r.rt),
		remote.WithUserAgent("fence"),
	}
}

// PushTree packs the directory tree dir exactly as it is on disk (owners,
// modes, times, extended attributes including overlay ones, hard links,
// character-device whiteouts as they are, symlinks not followed; sockets
// cannot be archived and are left out) as the one layer of an OCI image
// repo:tag under the registry's prefix, with meta as the image's
// configuration blob, and returns the manifest's digest ("sha256:…"). The
// layer streams from the disk to the registry. dir must not change while
// it is pushed.
func (r *Registry) PushTree(ctx context.Context, repo, tag, dir string, meta []byte) (digest string, err error) {
	rp, err := r.repository(repo)
	if err != nil {
		return "", err
	}
	ref, err := name.NewTag(rp.Name()+":"+tag, name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("tag %q: %w: %w", tag, err, ErrInvalid)
	}
	if fi, err := os.Lstat(dir); err != nil {
		return "", fmt.Errorf("pushing %s: %w", dir, err)
	} else if !fi.IsDir() {
		return "", fmt.Errorf("pushing %s: not a directory: %w", dir, ErrInvalid)
	}
	if len(meta) > maxMetaBytes {
		return "", fmt.Errorf("meta of %d bytes is over the limit of %d: %w", len(meta), maxMetaBytes, ErrInvalid)
	}
	start := time.Now()
	opts := r.options(ctx)

	cfg := static.NewLayer(meta, MetaMediaType)
	if err := remote.WriteLayer(rp, cfg, opts...); err != nil {
		return "", fmt.Errorf("pushing to the content registry %s: %w", r.URL(), err)
	}

	layer, skipped, err := r.pushLayer(ctx, rp, dir, opts)
	if err != nil {
		return "", err
	}

	layerDesc, err := partialDescriptor(layer, LayerMediaType)
	if err != nil {
		return "", err
	}
	cfgDesc, err := partialDescriptor(cfg, MetaMediaType)
	if err != nil {
		return "", err
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        cfgDesc,
		Layers:        []v1.Descriptor{layerDesc},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	if err := remote.Put(ref, rawManifest{raw}, opts...); err != nil {
		return "", fmt.Errorf("pushing the manifest of %s: %w", ref, err)
	}
	h, _, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		return "", err
	}
	r.log.Info("content registry: pushed", "ref", ref.String(), "digest", h.String(),
		"layer_bytes", layerDesc.Size, "skipped_sockets", skipped, "took", time.Since(start).Round(time.Millisecond))
	return h.String(), nil
}

// pushLayer streams the tar of dir, gzip-compressed, to the registry.
func (r *Registry) pushLayer(ctx context.Context, rp name.Repository, dir string, opts []remote.Option) (*stream.Layer, int, error) {
	pr, pw := io.Pipe()
	type result struct {
		skipped int
		err     error
	}
	done := make(chan result, 1)
	go func() {
		skipped, err := writeTree(ctx, dir, pw)
		pw.CloseWithError(err)
		done <- result{skipped, err}
	}()
	layer := stream.NewLayer(pr, stream.WithCompressionLevel(gzip.BestSpeed), stream.WithMediaType(LayerMediaType))
	uerr := remote.WriteLayer(rp, layer, opts...)
	pr.CloseWithError(io.ErrClosedPipe) // stops the writer if the upload stopped first
	res := <-done
	if res.err != nil {
		return nil, 0, fmt.Errorf("packing %s: %w", dir, res.err)
	}
	if uerr != nil {
		return nil, 0, fmt.Errorf("pushing %s to the content registry %s: %w", dir, r.URL(), uerr)
	}
	return layer, res.skipped, nil
}

// partialDescriptor is the descriptor of an uploaded blob.
func partialDescriptor(l v1.Layer, mt types.MediaType) (v1.Descriptor, error) {
	d, err := l.Digest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	n, err := l.Size()
	if err != nil {
		return v1.Descriptor{}, err
	}
	return v1.Descriptor{MediaType: mt, Size: n, Digest: d}, nil
}

// rawManifest is a manifest to put as is.
type rawManifest struct{ b []byte }

func (m rawManifest) RawManifest() ([]byte, error)        { return m.b, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
