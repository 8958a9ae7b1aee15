package ui

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
)

// The pieces of a dashboard session both of its servers (the daemon and
// fence router) apply alike; each keeps its sessions its own way.
const (
	// CookieName is the session cookie's name.
	CookieName = "fence_session"
	// CSRFHeader carries a session's CSRF token on every request.
	CSRFHeader = "X-Fence-CSRF"
)

// SecurityHeaders sets the headers of every dashboard answer: a
// Content-Security-Policy that runs only the dashboard's own scripts (no
// inline script, no eval) and reaches only its own origin, no framing;
// xterm.js sets style elements of its own, hence inline styles.
func SecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "+
		"img-src 'self' data:; font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// SameOrigin checks what the browser says of where r comes from: an
// Origin other than r's own, or a Sec-Fetch-Site other than same-origin,
// is a request another site made, and is an error.
func SameOrigin(r *http.Request) error {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return errors.New("a dashboard request must come from the dashboard's own origin (Sec-Fetch-Site: " + site + ")")
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return nil
	}
	u, err := url.Parse(o)
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if err != nil || u.Scheme != scheme || !strings.EqualFold(u.Host, r.Host) {
		return errors.New("a dashboard request must come from the dashboard's own origin")
	}
	return nil
}

// StripSession removes the session cookie and the CSRF token from h (a
// request about to go on), keeping its other cookies.
func StripSession(h http.Header) {
	h.Del(CSRFHeader)
	lines := h.Values("Cookie")
	if len(lines) == 0 {
		return
	}
	var kept []string
	for _, line := range lines {
		for part := range strings.SplitSeq(line, ";") {
			part = strings.TrimSpace(part)
			if name, _, _ := strings.Cut(part, "="); part != "" && name != CookieName {
				kept = append(kept, part)
			}
		}
	}
	h.Del("Cookie")
	if len(kept) > 0 {
		h.Set("Cookie", strings.Join(kept, "; "))
	}
}
