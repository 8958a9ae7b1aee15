// Package oci pulls container images from OCI/Docker registries (or reads
// them from an OCI layout or a `docker save` tarball) and unpacks them into
// a directory tree that fence can use as a template root filesystem.
//
// # Layer cache
//
// A Cache owns one directory:
//
//	<dir>/.lock                    flock: shared by Unpack and Import, exclusive for GC
//	<dir>/sha256-<hex>/tree/       one layer, extracted once (hex: the layer's DiffID)
//	<dir>/sha256-<hex>/layer.json  its whiteouts, opaque directories, size and file count
//	<dir>/.tmp-<random>/           a layer being extracted
//
// Layers are keyed by their DiffID (the sha256 of the uncompressed tar,
// listed in the image's configuration), so a layer pulled from a registry and
// the same layer imported from an archive share one copy, and a cached layer
// is never fetched again. The digest of every extracted stream is checked
// against its DiffID before the layer enters the cache.
//
// An image's root filesystem is the layers applied bottom first into dst:
// directories are created, and regular files and symlinks are hard links to
// the cached layers' inodes (a copy when dst is on another filesystem). Ten
// templates from one base image therefore cost one copy of its files. This
// is safe only because template trees are never written in place: a sandbox
// writes to its overlay's upper layer, which copies a file up first.
//
// # What an unpacked tree holds
//
//   - Whiteouts (.wh.NAME) and opaque directories (.wh..wh..opq) of a layer
//     hide the entries of the layers below it; they never appear in dst.
//   - Hard links are kept (within a layer, and to a file of a lower layer).
//   - Symlinks are kept as they are and never followed on the host: every
//     path is resolved inside the tree (os.Root), so a link to "/etc" or
//     "../../x" cannot make a later entry land outside it. An entry whose
//     name or hard-link target climbs out with ".." is an error.
//   - Owners (uid/gid) are kept; sandboxes mount a template as an idmapped
//     lower layer.
//   - Set-user-ID and set-group-ID bits are cleared. Sandboxes run with
//     no_new_privs and their overlay is mounted nosuid, so the bits could do
//     nothing there; cleared, they cannot do anything on the host either
//     (a setuid-root file from an image under the templates directory).
//   - Device nodes and FIFOs are dropped (a sandbox's /dev is its own).
//   - Extended attributes, file capabilities (security.capability) and ACLs
//     are dropped: with no_new_privs file capabilities grant nothing, and
//     a template carries no labels.
//   - Modification times of regular files are kept (Python's bytecode
//     caches check them).
//
// # Limits
//
// Options.MaxBytes (uncompressed), Options.MaxFiles and Options.MaxLayers
// bound one image. Every byte of a layer's uncompressed stream counts
// against MaxBytes as it is read (headers, skipped content, padding); only
// zero padding may follow a layer's tar end marker, and the first other
// byte there fails the layer without reading on; an image over a limit, a layer whose content does not
// match its digest, and a malformed or hostile layer fail with an error
// wrapping ErrInvalidImage. A failed Unpack or Import leaves dst empty and
// no partial layer in the cache.
//
// # Registries
//
// Pulls use the registry's token flow (anonymous, or with Options.Auth as
// basic credentials or a bearer token). Plain HTTP is used only for
// registries on a loopback address (localhost, 127.0.0.0/8, ::1), as Docker
// allows; every other request, token realms and blob redirects included,
// must be HTTPS. The host's Docker credentials are never read.
package oci

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/fencesandbox/fence/api"
)

// ErrNotImplemented is kept for callers written before the implementation.
var ErrNotImplemented = errors.New("oci: not implemented")

// ErrInvalidImage is wrapped by the errors of images that are malformed,
// hostile, over a limit, or whose content does not match its digests. It
// wraps api.ErrInvalidArgument.
var ErrInvalidImage = fmt.Errorf("invalid image: %w", api.ErrInvalidArgument)

// Auth is a registry credential. Exactly one form is set.
type Auth struct {
	Username string // basic auth (with Password)
	Password string
	// Token is a bearer/registry token used as is.
	Token string
}

// Default limits of one image.
const (
	DefaultMaxBytes  = 16 << 30 // uncompressed, all layers
	DefaultMaxFiles  = 2_000_000
	DefaultMaxLayers = 256
)

// Options configure one Unpack or Import.
type Options struct {
	// Auth for the registry of the reference; nil means anonymous (or the
	// registry's anonymous token flow).
	Auth *Auth
	// Platform is "os/arch[/variant]"; empty means linux/<host arch>.
	Platform string
	// Progress receives human-readable lines (layer digests, bytes, times).
	Progress io.Writer

	// MaxBytes bounds the uncompressed size of the image's layers
	// (DefaultMaxBytes if zero).
	MaxBytes int64
	// MaxFiles bounds the number of entries in the image's layers
	// (DefaultMaxFiles if zero).
	MaxFiles int64
	// MaxLayers bounds the number of layers (DefaultMaxLayers if zero).
	MaxLayers int
	// Copy writes dst's files as copies instead of hard links to the
	// cache's, for a caller that will change the tree in place. (A tree of
	// hard links must never be written in place: the change would reach
	// the cache and every tree sharing the layer.)
	Copy bool
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
	// Ref is the reference as resolved (registry/repo:tag or @digest); for
	// an archive, the path and the image's tag, if it names one.
	Ref string
	// Digest is the manifest digest (sha256:...) the unpack used, to pin
	// in the build record. A `docker save` tarball holds no registry
	// manifest: its Digest is the image ID (the configuration's digest).
	Digest string
	Config Config
	// Layers are the layers' DiffIDs (sha256 of the uncompressed tar, the
	// cache's keys), bottom first. Pass them to GC to keep the layers.
	Layers []string
	// Bytes and Files total the image's layers (uncompressed).
	Bytes, Files int64
}

// Unpack pulls ref from its registry and writes the image's root
// filesystem into dst, an existing empty directory.
func (c *Cache) Unpack(ctx context.Context, ref, dst string, opts Options) (Image, error) {
	src, err := remoteSource(ctx, ref, opts)
	if err != nil {
		return Image{}, err
	}
	return c.unpack(ctx, src, dst, opts)
}

// Import reads an image from an OCI layout directory or a `docker save`
// tarball at path (ref selects the image when it holds several; empty
// means the only one) and writes its root filesystem into dst.
func (c *Cache) Import(ctx context.Context, path, ref, dst string, opts Options) (Image, error) {
	src, err := archiveSource(path, ref, opts)
	if err != nil {
		return Image{}, err
	}
	return c.unpack(ctx, src, dst, opts)
}
