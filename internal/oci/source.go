package oci

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// source is an image to unpack, before any layer is read.
type source struct {
	img    v1.Image
	ref    string
	digest string
	// manifest: the image has a real manifest, whose layer sizes bound
	// the download before it starts (a docker-save tarball has none, and
	// go-containerregistry would compress every layer to make one).
	manifest bool
}

// platform parses opts.Platform (default linux/<host arch>).
func platform(s string) (v1.Platform, error) {
	if s == "" {
		return v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, nil
	}
	p, err := v1.ParsePlatform(s)
	if err != nil {
		return v1.Platform{}, fmt.Errorf("platform %q: %w: %w", s, err, ErrInvalidImage)
	}
	return *p, nil
}

// remoteSource resolves ref at its registry: the manifest and the
// configuration are fetched, no layer yet.
func remoteSource(ctx context.Context, ref string, opts Options) (source, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return source{}, fmt.Errorf("image reference %q: %w: %w", ref, err, ErrInvalidImage)
	}
	plat, err := platform(opts.Platform)
	if err != nil {
		return source{}, err
	}
	auth, err := opts.Auth.Authenticator()
	if err != nil {
		return source{}, err
	}
	img, err := remote.Image(r,
		remote.WithContext(ctx),
		remote.WithAuth(auth),
		remote.WithPlatform(plat),
		remote.WithTransport(loopbackOnlyHTTP{next: remote.DefaultTransport}),
		remote.WithUserAgent("fence"),
	)
	if err != nil {
		return source{}, fmt.Errorf("pulling %s: %w", r.Name(), err)
	}
	d, err := img.Digest()
	if err != nil {
		return source{}, fmt.Errorf("pulling %s: %w", r.Name(), err)
	}
	return source{img: img, ref: r.Name(), digest: d.String(), manifest: true}, nil
}

// Authenticator returns the go-containerregistry authenticator of a:
// anonymous (or the registry's anonymous token flow) when a is nil, basic
// credentials exchanged through the registry's token flow when it asks for
// one, or a registry token used as is.
func (a *Auth) Authenticator() (authn.Authenticator, error) {
	switch {
	case a == nil:
		return authn.Anonymous, nil
	case a.Token != "" && a.Username == "" && a.Password == "":
		return authn.FromConfig(authn.AuthConfig{RegistryToken: a.Token}), nil
	case a.Token == "" && a.Username != "":
		return authn.FromConfig(authn.AuthConfig{Username: a.Username, Password: a.Password}), nil
	default:
		return nil, fmt.Errorf("registry credentials: want a username and password, or a token: %w", ErrInvalidImage)
	}
}

// Transport returns the RoundTripper fence reaches registries with:
// go-containerregistry's default transport trusting the system's CAs, plus
// the PEM certificates of caFile when it is not empty, and refusing plain
// HTTP to any host off the loopback address (redirects included, since
// each hop is a request of its own).
func Transport(caFile string) (http.RoundTripper, error) {
	if caFile == "" {
		return loopbackOnlyHTTP{next: remote.DefaultTransport}, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("registry CA file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("registry CA file %s: no PEM certificate in it", caFile)
	}
	t := remote.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return loopbackOnlyHTTP{next: t}, nil
}

// loopbackOnlyHTTP refuses plain-HTTP requests to hosts that are not on a
// loopback address. go-containerregistry also speaks HTTP to private
// (RFC 1918) and .local registries; fence does not.
type loopbackOnlyHTTP struct{ next http.RoundTripper }

func (t loopbackOnlyHTTP) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" && !IsLoopback(req.URL.Hostname()) {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("refusing plain-HTTP request to %s: registries off the loopback address need HTTPS", req.URL.Host)
	}
	return t.next.RoundTrip(req)
}

// IsLoopback reports whether host (no port) is localhost or a loopback IP:
// the only hosts fence speaks plain HTTP to.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// archiveSource opens an OCI layout directory or a `docker save` tarball.
func archiveSource(path, ref string, opts Options) (source, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return source{}, fmt.Errorf("image archive: %w", err)
	}
	if fi.IsDir() {
		return layoutSource(path, ref, opts)
	}
	var tag *name.Tag
	if ref != "" {
		t, err := name.NewTag(ref)
		if err != nil {
			return source{}, fmt.Errorf("image tag %q: %w: %w", ref, err, ErrInvalidImage)
		}
		tag = &t
	}
	img, err := tarball.ImageFromPath(path, tag)
	if err != nil {
		return source{}, fmt.Errorf("reading docker-save tarball %s: %w: %w", path, err, ErrInvalidImage)
	}
	// A docker-save tarball has no registry manifest (go-containerregistry
	// would compress every layer to make one): pin the image ID.
	id, err := img.ConfigName()
	if err != nil {
		return source{}, fmt.Errorf("reading docker-save tarball %s: %w: %w", path, err, ErrInvalidImage)
	}
	r := path
	if tag != nil {
		r += ":" + tag.String()
	}
	return source{img: img, ref: r, digest: id.String()}, nil
}

// refAnnotations name an image inside an OCI layout.
var refAnnotations = []string{"org.opencontainers.image.ref.name", "io.containerd.image.name"}

// layoutSource selects an image from an OCI layout: the one whose ref
// annotation is ref (in full or its tag), or the only one.
func layoutSource(path, ref string, opts Options) (source, error) {
	bad := func(err error) (source, error) {
		return source{}, fmt.Errorf("reading OCI layout %s: %w: %w", path, err, ErrInvalidImage)
	}
	idx, err := layout.ImageIndexFromPath(path)
	if err != nil {
		return bad(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return bad(err)
	}
	var matches []v1.Descriptor
	for _, d := range im.Manifests {
		if ref == "" || annotationMatches(d.Annotations, ref) {
			matches = append(matches, d)
		}
	}
	switch {
	case len(matches) == 0 && ref != "":
		return bad(fmt.Errorf("no image named %q", ref))
	case len(matches) == 0:
		return bad(errors.New("no image"))
	case len(matches) > 1:
		// Several entries for one name: the same image listed by tag and
		// by name, or several images; choose only when they agree.
		for _, d := range matches[1:] {
			if d.Digest != matches[0].Digest {
				return bad(fmt.Errorf("%d images: name one with a ref", len(matches)))
			}
		}
	}
	d := matches[0]
	plat, err := platform(opts.Platform)
	if err != nil {
		return source{}, err
	}
	var img v1.Image
	switch {
	case d.MediaType.IsIndex():
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return bad(err)
		}
		img, err = platformImage(child, plat)
		if err != nil {
			return bad(err)
		}
	case d.MediaType.IsImage() || d.MediaType == types.OCIManifestSchema1 || d.MediaType == types.DockerManifestSchema2:
		img, err = idx.Image(d.Digest)
		if err != nil {
			return bad(err)
		}
	default:
		return bad(fmt.Errorf("unsupported manifest media type %q", d.MediaType))
	}
	dg, err := img.Digest()
	if err != nil {
		return bad(err)
	}
	r := path
	if ref != "" {
		r += ":" + ref
	}
	return source{img: img, ref: r, digest: dg.String(), manifest: true}, nil
}

// platformImage picks plat's image from an index (one level deep).
func platformImage(idx v1.ImageIndex, plat v1.Platform) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range im.Manifests {
		if d.MediaType.IsImage() && (d.Platform == nil || d.Platform.Satisfies(plat)) {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("no image for platform %s", plat.String())
}

func annotationMatches(ann map[string]string, ref string) bool {
	for _, k := range refAnnotations {
		v := ann[k]
		if v == "" {
			continue
		}
		if v == ref {
			return true
		}
		// "docker.io/library/debian:12" matches "debian:12" and "12".
		if t, err := name.NewTag(ref); err == nil {
			if t2, err := name.NewTag(v); err == nil && t.Name() == t2.Name() {
				return true
			}
		}
		if i := strings.LastIndex(v, ":"); i >= 0 && !strings.Contains(v[i:], "/") && v[i+1:] == ref {
			return true
		}
	}
	return false
}
