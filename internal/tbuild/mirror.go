package tbuild

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

// CheckAllow validates build allowlist entries (allowOut entries: names,
// "*."-wildcards, addresses, CIDRs, presets, each with optional ports)
// the way a sandbox's network is validated.
func CheckAllow(entries []string) error {
	for _, e := range entries {
		if _, err := policy.FromE2B(nil, &api.NetworkConfig{AllowOut: []string{e}, DenyOut: []string{policy.AllTraffic}}); err != nil {
			return fmt.Errorf("build allowlist entry %q: %w", e, err)
		}
	}
	return nil
}

// PipIndex is a package index every build step's pip is pointed at.
type PipIndex struct {
	URL  string
	host string // host:port, for the allowlist and PIP_TRUSTED_HOST
	http bool
}

// ParsePipIndex checks an index URL (http or https, with a host, no
// credentials, query or fragment) and returns it.
func ParsePipIndex(raw string) (*PipIndex, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("pip index URL %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("pip index URL %q: the scheme must be http or https", raw)
	}
	if u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(raw, " \t\n'\"") {
		return nil, fmt.Errorf("pip index URL %q: want scheme://host[:port]/path, without credentials, query or fragment", raw)
	}
	port := u.Port()
	if port == "" {
		port = "443"
		if u.Scheme == "http" {
			port = "80"
		}
	}
	p := &PipIndex{URL: raw, host: net.JoinHostPort(u.Hostname(), port), http: u.Scheme == "http"}
	if err := CheckAllow([]string{p.allow()}); err != nil {
		return nil, fmt.Errorf("pip index URL %q: %w", raw, err)
	}
	return p, nil
}

// allow is the allowlist entry that admits the index.
func (p *PipIndex) allow() string {
	h, port, _ := net.SplitHostPort(p.host)
	if strings.Contains(h, ":") {
		return "[" + h + "]:" + port
	}
	return h + ":" + port
}

// env is what build steps get: pip reads PIP_INDEX_URL, and an index over
// plain HTTP must also be a trusted host.
func (p *PipIndex) env() map[string]string {
	m := map[string]string{"PIP_INDEX_URL": p.URL}
	if p.http {
		m["PIP_TRUSTED_HOST"] = p.host
	}
	return m
}
