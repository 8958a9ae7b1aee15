// Package oci pulls container images from OCI/Docker registries (or reads
// them from an OCI layout or a `docker save` tarball) and unpacks them into
// a directory tree that fence can use as a template root filesystem.
//
// This file fixes the package's API so that template builds can be written
// against it; the implementation fills it in.
package oci

import (
	"context"
	"errors"
	"io"
)

// ErrNotImplemented is returned while the package is being built.
var ErrNotImplemented = errors.New("oci: not implemented")

// Auth is a registry credential. Exactly one form is set.
type Auth struct {
	Username string // basic auth (with Password)
	Password string
	// Token is a bearer/registry token used as is.
	Token string
}

// Options configure one Unpack or Import.
type Options struct {
	// Auth for the registry of the reference; nil means anonymous (or the
	// registry's anonymous token flow).
	Auth *Auth
	// Platform is "os/arch[/variant]"; empty means linux/<host arch>.
	Platform string
	// Progress receives human-readable lines (layer digests, bytes, times).
	Progress io.Writer
}

// Config is the part of an image's configuration a template keeps.
type Config struct {
	Env        []string // KEY=VALUE
	WorkingDir string
	User       string
	Entrypoint []string
	Cmd        []string
}

// Image describes what was unpacked.
type Image struct {
	// Ref is the reference as resolved (registry/repo:tag or @digest).
	Ref string
	// Digest is the manifest digest (sha256:...) the unpack used, to pin
	// in the build record.
	Digest string
	Config Config
	// Layers are the layer digests, bottom first.
	Layers []string
}

// Cache is a content-addressed layer cache shared by every template.
type Cache struct {
	dir string
}

// NewCache opens (creating if needed) the layer cache under dir.
func NewCache(dir string) (*Cache, error) {
	return &Cache{dir: dir}, ErrNotImplemented
}

// Unpack pulls ref from its registry and writes the image's root
// filesystem into dst, an existing empty directory.
func (c *Cache) Unpack(ctx context.Context, ref, dst string, opts Options) (Image, error) {
	return Image{}, ErrNotImplemented
}

// Import reads an image from an OCI layout directory or a `docker save`
// tarball at path (ref selects the image when it holds several; empty
// means the only one) and writes its root filesystem into dst.
func (c *Cache) Import(ctx context.Context, path, ref, dst string, opts Options) (Image, error) {
	return Image{}, ErrNotImplemented
}

// GC removes cached layers no template uses; keep lists the layer digests
// still in use. It returns the bytes freed.
func (c *Cache) GC(ctx context.Context, keep []string) (int64, error) {
	return 0, ErrNotImplemented
}
