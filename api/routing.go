package api

import (
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HeaderSignatureProbe on a signed /files request asks only whether the
// daemon holds the sandbox the signature is for: 204 if it does (the
// request is not served), the usual refusal if not. A router in front of
// several daemons finds an upload's daemon this way before it sends the
// body. It reveals nothing the request itself would not.
const HeaderSignatureProbe = "X-Fence-Signature-Probe"

// SandboxTarget reports whether r is sandbox traffic to a daemon whose
// sandbox domain is domain, and the sandbox ID and port it names. A
// request is sandbox traffic when it carries HeaderSandboxID (then
// HeaderSandboxPort must name a port), or when its Host is
// {port}-{id}.{domain} or {port}-{id}.localhost. A request that names a
// sandbox badly is sandbox traffic with an error wrapping
// ErrInvalidArgument. The ID is not checked (see ValidSandboxID): an ID
// of the wrong shape names no sandbox, which is the answer's business.
//
// The daemon and fence router both route with it, so a request reaches
// the node that would serve it.
func SandboxTarget(r *http.Request, domain string) (id string, port int, ok bool, err error) {
	if id := r.Header.Get(HeaderSandboxID); id != "" {
		p := r.Header.Get(HeaderSandboxPort)
		if p == "" {
			//lint:ignore ST1005 E2B's wording, which the e2b SDKs show as it is.
			return "", 0, true, fmt.Errorf("Missing header: %s: %w", HeaderSandboxPort, ErrInvalidArgument)
		}
		port, err := strconv.Atoi(p)
		if err != nil || port < 1 || port > 65535 {
			return "", 0, true, fmt.Errorf("invalid %s header %q: %w", HeaderSandboxPort, p, ErrInvalidArgument)
		}
		return id, port, true, nil
	}
	host := strings.ToLower(r.Host)
	if hh, _, err := net.SplitHostPort(host); err == nil {
		host = hh
	}
	for _, suffix := range []string{"." + strings.ToLower(domain), ".localhost"} {
		if suffix == "." || !strings.HasSuffix(host, suffix) {
			continue
		}
		label := strings.TrimSuffix(host, suffix)
		if strings.Contains(label, ".") {
			continue
		}
		p, id, ok := strings.Cut(label, "-")
		port, err := strconv.Atoi(p)
		if !ok || err != nil || port < 1 || port > 65535 || id == "" {
			continue
		}
		return id, port, true, nil
	}
	return "", 0, false, nil
}

// sandboxIDMaxLen is the longest sandbox ID.
const sandboxIDMaxLen = 64

// ValidSandboxID reports whether id has the shape of a sandbox ID: 1 to 64
// characters of [a-z0-9]. Anything else can never name a sandbox.
func ValidSandboxID(id string) bool {
	if len(id) == 0 || len(id) > sandboxIDMaxLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// PageToken returns the opaque listing token (HeaderNextToken) that
// continues a listing of sandboxes after the one with ID id started at
// startedAt. A daemon and fence router make and read the same tokens, so a
// listing merged from several daemons continues on each of them.
func PageToken(startedAt time.Time, id string) string {
	raw := strconv.FormatInt(startedAt.UnixNano(), 10) + "_" + id
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

// ParsePageToken returns the start time and sandbox ID a PageToken was
// made from; a token PageToken did not make is an error wrapping
// ErrInvalidArgument.
func ParsePageToken(tok string) (startedAt time.Time, id string, err error) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("invalid page token: %w", ErrInvalidArgument)
	}
	ns, id, ok := strings.Cut(string(raw), "_")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || !ValidSandboxID(id) {
		return time.Time{}, "", fmt.Errorf("invalid page token: %w", ErrInvalidArgument)
	}
	return time.Unix(0, n), id, nil
}
