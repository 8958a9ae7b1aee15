package native

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Where a sandbox finds the CA it trusts on top of its template's roots.
const (
	// CABundlePath is the system bundle (Debian, Ubuntu, Alpine, and what
	// OpenSSL, GnuTLS, curl, Python and Go read by default).
	CABundlePath = "/etc/ssl/certs/ca-certificates.crt"
	// CAPath holds the added CA alone (Node's NODE_EXTRA_CA_CERTS).
	CAPath = "/etc/fence/ca.pem"
)

// CAEnv are the variables that point the usual tools at the bundle,
// for those that do not read the system one (Node, pip and requests with
// their own bundles, git built against another TLS library, cargo).
func CAEnv() map[string]string {
	return map[string]string{
		"SSL_CERT_FILE":       CABundlePath,
		"NODE_EXTRA_CA_CERTS": CAPath,
		"REQUESTS_CA_BUNDLE":  CABundlePath,
		"CURL_CA_BUNDLE":      CABundlePath,
		"GIT_SSL_CAINFO":      CABundlePath,
		"PIP_CERT":            CABundlePath,
		"CARGO_HTTP_CAINFO":   CABundlePath,
		"AWS_CA_BUNDLE":       CABundlePath,
	}
}

// maxBundle bounds the template bundle read from a template.
const maxBundle = 8 << 20

// installCA writes the sandbox's own CA bundle (its template's with the
// trusted CA added) and the CA alone into its writable layer, and returns
// the paths it made so the caller can hand them to the sandbox's root.
// Without a TrustedCA it does nothing. The template is never written.
func (s *sandbox) installCA(upper, rootfs string, uid int) ([]string, error) {
	ca := s.b.opts.TrustedCA
	if len(ca) == 0 {
		return nil, nil
	}
	bundle, err := s.b.caBundle(rootfs)
	if err != nil {
		return nil, err
	}
	var made []string
	mkdir := func(rel string) error {
		p := filepath.Join(upper, rel)
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating sandbox %s: %w", rel, err)
		}
		made = append(made, p)
		return nil
	}
	for _, d := range []string{"etc/ssl", "etc/ssl/certs", "etc/fence"} {
		if err := mkdir(d); err != nil {
			return nil, err
		}
	}
	for rel, content := range map[string][]byte{CABundlePath[1:]: bundle, CAPath[1:]: ca} {
		p := filepath.Join(upper, rel)
		if err := os.WriteFile(p, content, 0o644); err != nil {
			return nil, fmt.Errorf("writing sandbox %s: %w", rel, err)
		}
		made = append(made, p)
	}
	return made, nil
}

// caBundle returns the template's CA bundle with TrustedCA appended,
// reading the template once. The bundle is read inside the template's
// root, so a symlink in the template cannot point the daemon elsewhere.
func (b *Backend) caBundle(rootfs string) ([]byte, error) {
	if v, ok := b.bundles.Load(rootfs); ok {
		return v.([]byte), nil
	}
	var base []byte
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil, fmt.Errorf("opening template root: %w", err)
	}
	defer root.Close()
	f, err := root.Open(CABundlePath[1:])
	switch {
	case err == nil:
		base, err = io.ReadAll(io.LimitReader(f, maxBundle))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("reading template CA bundle: %w", err)
		}
	case errors.Is(err, fs.ErrNotExist):
	default:
		// A bundle the template makes unreadable or points out of its
		// root: the sandbox gets the added CA alone.
		b.log.Warn("template CA bundle not usable", "rootfs", rootfs, "err", err)
	}
	bundle := make([]byte, 0, len(base)+len(b.opts.TrustedCA)+64)
	bundle = append(bundle, base...)
	if len(bundle) > 0 && !bytes.HasSuffix(bundle, []byte("\n")) {
		bundle = append(bundle, '\n')
	}
	bundle = append(bundle, "# fence egress gateway\n"...)
	bundle = append(bundle, b.opts.TrustedCA...)
	b.bundles.Store(rootfs, bundle)
	return bundle, nil
}
