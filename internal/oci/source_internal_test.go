package oci

import (
	"net/http"
	"strings"
	"testing"
)

type recordingTransport struct{ hosts []string }

func (r *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r.hosts = append(r.hosts, req.URL.Host)
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
}

// TestLoopbackOnlyHTTP sends registry, token-realm and redirect requests
// through the pull's transport: plain HTTP goes out only to loopback
// hosts, HTTPS anywhere.
func TestLoopbackOnlyHTTP(t *testing.T) {
	next := &recordingTransport{}
	tr := loopbackOnlyHTTP{next: next}
	for url, ok := range map[string]bool{
		"http://127.0.0.1:5000/v2/":          true,
		"http://127.8.9.10/v2/":              true,
		"http://localhost:5000/v2/":          true,
		"http://[::1]:5000/v2/":              true,
		"http://10.0.0.5:5000/v2/":           false, // go-containerregistry's own rule allows RFC 1918
		"http://192.168.1.1/token":           false,
		"http://registry.local:5000/v2/":     false,
		"http://localhost.evil.com/v2/":      false,
		"http://cdn.example.com/blob":        false,
		"https://registry-1.docker.io/v2/":   true,
		"https://10.0.0.5:5000/v2/":          true,
		"http://[::ffff:127.0.0.1]:5000/v2/": true,
	} {
		req, _ := http.NewRequest("GET", url, nil)
		_, err := tr.RoundTrip(req)
		if ok != (err == nil) {
			t.Errorf("RoundTrip(%s) = %v, want allowed=%v", url, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "plain-HTTP") {
			t.Errorf("RoundTrip(%s) = %v, want a plain-HTTP refusal", url, err)
		}
	}
}
