// Package contentreg moves directory trees between the nodes of a fence
// cluster through an OCI registry (the cluster's content registry).
//
// A tree is pushed as an OCI image whose one layer is a gzip-compressed
// tar of the tree exactly as it is on disk (owners, modes, times, extended
// attributes including overlay ones such as trusted.overlay.opaque, hard
// links, character-device whiteouts, symlinks as symlinks) and whose
// configuration blob is the caller's opaque meta bytes. Neither push nor
// pull holds a layer in memory: both stream.
//
// Guarantees:
//   - A pull names the image by its manifest digest, and the manifest and
//     every blob are checked against their digests as they are read; any
//     difference is an error wrapping ErrDigestMismatch, and the target
//     directory is then not created.
//   - A pull writes the tree beside its target and renames it into place:
//     the target exists complete or not at all.
//   - The registry is reached over HTTPS (system CAs, plus Options.CAFile),
//     or plain HTTP only when it is on a loopback address; a loopback
//     registry's requests never leave the loopback address (a redirect off
//     it is refused).
package contentreg

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/oci"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// ErrDigestMismatch is wrapped by the errors of a pull whose manifest or
// blobs are not the bytes their digests name.
var ErrDigestMismatch = errors.New("content registry: digest mismatch")

// ErrInvalid is wrapped by the errors of bad arguments (a malformed URL,
// repository, tag or digest). It wraps api.ErrInvalidArgument.
var ErrInvalid = fmt.Errorf("content registry: %w", api.ErrInvalidArgument)

// Media types of what PushTree writes.
const (
	// MetaMediaType is the media type of the configuration blob (the
	// caller's meta bytes).
	MetaMediaType = "application/vnd.fencesandbox.tree.meta.v1"
	// LayerMediaType is the media type of the tree's layer: the OCI gzip
	// tar layer type, though its whiteouts are character devices (as on an
	// overlay's upper directory), not .wh. files.
	LayerMediaType = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// maxMetaBytes bounds the configuration blob a pull reads into memory.
const maxMetaBytes = 4 << 20

// Options configure a Registry.
type Options struct {
	// URL is "host[:port]/path-prefix" of the cluster's registry (e.g.
	// 127.0.0.1:5000/fence), with no scheme; the prefix may be empty.
	URL string
	// Username and Password are optional basic credentials (exchanged
	// through the registry's token flow when it asks for one).
	Username, Password string
	// CAFile is an optional PEM file of CA certificates trusted besides
	// the system's.
	CAFile string
	// Logger receives one line per push and pull; nil discards.
	Logger *slog.Logger
}

// Registry is a cluster's content registry. It is safe for concurrent use.
type Registry struct {
	host   string // host[:port]
	prefix string // path prefix, no leading or trailing slash; may be empty
	auth   authn.Authenticator
	rt     http.RoundTripper
	log    *slog.Logger
}

// New checks opts and returns the registry. It does not contact it.
func New(opts Options) (*Registry, error) {
	u := strings.TrimSpace(opts.URL)
	if u == "" {
		return nil, fmt.Errorf("registry URL is empty: want host[:port]/path-prefix: %w", ErrInvalid)
	}
	if strings.Contains(u, "://") {
		return nil, fmt.Errorf("registry URL %q: want host[:port]/path-prefix with no scheme (HTTPS is used, or plain HTTP to a loopback address): %w", opts.URL, ErrInvalid)
	}
	host, prefix, _ := strings.Cut(u, "/")
	prefix = strings.Trim(prefix, "/")
	if host == "" {
		return nil, fmt.Errorf("registry URL %q: no host: %w", opts.URL, ErrInvalid)
	}
	if _, err := name.NewRegistry(host, name.StrictValidation); err != nil {
		return nil, fmt.Errorf("registry URL %q: %w: %w", opts.URL, err, ErrInvalid)
	}
	if prefix != "" {
		if _, err := name.NewRepository(host+"/"+prefix, name.StrictValidation); err != nil {
			return nil, fmt.Errorf("registry URL %q: path prefix %q: %w: %w", opts.URL, prefix, err, ErrInvalid)
		}
	}
	if (opts.Username == "") != (opts.Password == "") {
		return nil, fmt.Errorf("registry credentials: give both a username and a password, or neither: %w", ErrInvalid)
	}
	var cred *oci.Auth
	if opts.Username != "" {
		cred = &oci.Auth{Username: opts.Username, Password: opts.Password}
	}
	auth, err := cred.Authenticator()
	if err != nil {
		return nil, err
	}
	rt, err := oci.Transport(opts.CAFile)
	if err != nil {
		return nil, err
	}
	if oci.IsLoopback(hostname(host)) {
		rt = stayOnLoopback{next: rt}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registry{host: host, prefix: prefix, auth: auth, rt: rt, log: log}, nil
}

// URL returns the registry's host[:port]/path-prefix.
func (r *Registry) URL() string {
	if r.prefix == "" {
		return r.host
	}
	return r.host + "/" + r.prefix
}

// repository returns the repository repo under the prefix.
func (r *Registry) repository(repo string) (name.Repository, error) {
	if repo == "" || strings.HasPrefix(repo, "/") || strings.HasSuffix(repo, "/") {
		return name.Repository{}, fmt.Errorf("repository %q: %w", repo, ErrInvalid)
	}
	full := r.host + "/" + repo
	if r.prefix != "" {
		full = r.host + "/" + r.prefix + "/" + repo
	}
	rp, err := name.NewRepository(full, name.StrictValidation)
	if err != nil {
		return name.Repository{}, fmt.Errorf("repository %q: %w: %w", repo, err, ErrInvalid)
	}
	return rp, nil
}

// hostname strips the port of host[:port] (and an IPv6 literal's brackets).
func hostname(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	return strings.Trim(host, "[]")
}

// stayOnLoopback refuses requests to hosts off the loopback address: the
// transport of a loopback registry, so that a redirect cannot send its
// requests (or its credentials' tokens) elsewhere.
type stayOnLoopback struct{ next http.RoundTripper }

func (t stayOnLoopback) RoundTrip(req *http.Request) (*http.Response, error) {
	if !oci.IsLoopback(req.URL.Hostname()) {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("refusing a request to %s: the content registry is on the loopback address and its requests stay there", req.URL.Host)
	}
	return t.next.RoundTrip(req)
}
