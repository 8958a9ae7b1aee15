package gateway

import (
	"net/url"
	"path"
	"regexp"
	"strings"

	"github.com/fencesandbox/fence/internal/egress/policy"
)

// artifact is a package file recognised from a registry URL.
type artifact struct {
	Ecosystem, Name, Version string
}

var pep503 = regexp.MustCompile(`[-_.]+`)

// artifactOf recognises a package artifact from a registry host (one of
// [policy.Presets]) and an URL path (escaped, as sent). ok is false for
// anything else: indexes, metadata, signatures.
func artifactOf(host, escapedPath string) (a artifact, ok bool) {
	preset := policy.PresetOf(host)
	if preset == "" {
		return artifact{}, false
	}
	p, err := url.PathUnescape(escapedPath)
	if err != nil || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
		return artifact{}, false
	}
	switch preset {
	case "@pypi":
		return pypiArtifact(host, p)
	case "@npm":
		return npmArtifact(p)
	case "@debian":
		return debianArtifact(p)
	case "@go":
		return goArtifact(host, p)
	case "@crates":
		return crateArtifact(host, p)
	case "@github":
		return githubArtifact(host, p)
	}
	return artifact{}, false
}

// pypiArtifact: files.pythonhosted.org/packages/…/NAME-VERSION(-…).whl,
// NAME-VERSION.tar.gz or NAME-VERSION.zip. Names are normalised (PEP 503).
func pypiArtifact(host, p string) (artifact, bool) {
	if host != "files.pythonhosted.org" || !strings.HasPrefix(p, "/packages/") {
		return artifact{}, false
	}
	file := path.Base(p)
	var name, version string
	switch {
	case strings.HasSuffix(file, ".whl"):
		parts := strings.Split(strings.TrimSuffix(file, ".whl"), "-")
		if len(parts) < 5 {
			return artifact{}, false
		}
		name, version = parts[0], parts[1]
	default:
		var stem string
		for _, ext := range []string{".tar.gz", ".zip", ".tar.bz2", ".tgz"} {
			if s, ok := strings.CutSuffix(file, ext); ok {
				stem = s
				break
			}
		}
		i := strings.LastIndexByte(stem, '-')
		if i <= 0 || i == len(stem)-1 {
			return artifact{}, false
		}
		name, version = stem[:i], stem[i+1:]
	}
	if name == "" || version == "" {
		return artifact{}, false
	}
	return artifact{"pypi", strings.ToLower(pep503.ReplaceAllString(name, "-")), version}, true
}

// npmArtifact: /NAME/-/NAME-VERSION.tgz and /@scope/name/-/name-VERSION.tgz.
func npmArtifact(p string) (artifact, bool) {
	pkg, file, ok := strings.Cut(strings.TrimPrefix(p, "/"), "/-/")
	if !ok || strings.Contains(file, "/") || !strings.HasSuffix(file, ".tgz") {
		return artifact{}, false
	}
	base := pkg
	if strings.HasPrefix(pkg, "@") {
		scope, n, ok := strings.Cut(pkg, "/")
		if !ok || len(scope) < 2 || n == "" || strings.Contains(n, "/") {
			return artifact{}, false
		}
		base = n
	} else if strings.Contains(pkg, "/") || pkg == "" {
		return artifact{}, false
	}
	version, ok := strings.CutPrefix(strings.TrimSuffix(file, ".tgz"), base+"-")
	if !ok || version == "" {
		return artifact{}, false
	}
	return artifact{"npm", pkg, version}, true
}

// debianArtifact: …/pool/…/NAME_VERSION_ARCH.deb (or .udeb).
func debianArtifact(p string) (artifact, bool) {
	if !strings.Contains(p, "/pool/") {
		return artifact{}, false
	}
	file := path.Base(p)
	stem, ok := strings.CutSuffix(file, ".deb")
	if !ok {
		if stem, ok = strings.CutSuffix(file, ".udeb"); !ok {
			return artifact{}, false
		}
	}
	parts := strings.Split(stem, "_")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return artifact{}, false
	}
	return artifact{"debian", parts[0], parts[1]}, true
}

// goArtifact: proxy.golang.org/MODULE/@v/VERSION.zip, with the proxy's
// case encoding ("!a" for "A") undone.
func goArtifact(host, p string) (artifact, bool) {
	if host != "proxy.golang.org" {
		return artifact{}, false
	}
	mod, file, ok := strings.Cut(strings.TrimPrefix(p, "/"), "/@v/")
	if !ok || mod == "" || strings.Contains(file, "/") {
		return artifact{}, false
	}
	version, ok := strings.CutSuffix(file, ".zip")
	if !ok || version == "" {
		return artifact{}, false
	}
	m, ok1 := goUnescape(mod)
	v, ok2 := goUnescape(version)
	if !ok1 || !ok2 {
		return artifact{}, false
	}
	return artifact{"go", m, v}, true
}

func goUnescape(s string) (string, bool) {
	var b strings.Builder
	bang := false
	for _, r := range s {
		switch {
		case bang:
			if r < 'a' || r > 'z' {
				return "", false
			}
			b.WriteRune(r - 'a' + 'A')
			bang = false
		case r == '!':
			bang = true
		case r >= 'A' && r <= 'Z':
			return "", false // upper case is always escaped
		default:
			b.WriteRune(r)
		}
	}
	return b.String(), !bang
}

// crateArtifact: static.crates.io/crates/NAME/NAME-VERSION.crate and
// crates.io/api/v1/crates/NAME/VERSION/download.
func crateArtifact(host, p string) (artifact, bool) {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	switch {
	case host == "static.crates.io" && len(parts) == 3 && parts[0] == "crates":
		version, ok := strings.CutPrefix(strings.TrimSuffix(parts[2], ".crate"), parts[1]+"-")
		if !ok || version == "" || !strings.HasSuffix(parts[2], ".crate") {
			return artifact{}, false
		}
		return artifact{"crates", parts[1], version}, true
	case host == "crates.io" && len(parts) == 6 && parts[0] == "api" && parts[1] == "v1" &&
		parts[2] == "crates" && parts[5] == "download" && parts[3] != "" && parts[4] != "":
		return artifact{"crates", parts[3], parts[4]}, true
	}
	return artifact{}, false
}

// githubArtifact: github.com/OWNER/REPO/releases/download/TAG/FILE.
func githubArtifact(host, p string) (artifact, bool) {
	if host != "github.com" {
		return artifact{}, false
	}
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	if len(parts) < 6 || parts[2] != "releases" || parts[3] != "download" {
		return artifact{}, false
	}
	for _, s := range parts {
		if s == "" {
			return artifact{}, false
		}
	}
	return artifact{"github", parts[0] + "/" + parts[1], strings.Join(parts[4:len(parts)-1], "/")}, true
}
