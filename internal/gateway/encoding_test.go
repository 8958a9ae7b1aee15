package gateway

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
)

// interim is one 1xx response the sandbox's client received.
type interim struct {
	code   int
	header textproto.MIMEHeader
}

// getWithInterim is get that also returns the 1xx responses the client saw.
func getWithInterim(t *testing.T, c *http.Client, url string) (*http.Response, string, []interim) {
	t.Helper()
	var got []interim
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hc := make(textproto.MIMEHeader, len(h))
		for k, vs := range h {
			hc[k] = append([]string(nil), vs...)
		}
		got = append(got, interim{code, hc})
		return nil
	}}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp, string(b), got
}

// TestInformationalResponsesMasked has a bound host echo the injected
// value in a 103 Early Hints, in header values and in a header name: the
// sandbox gets the 103 with the value masked and the named header
// dropped, over either protocol on either side.
func TestInformationalResponsesMasked(t *testing.T) {
	for _, up := range []string{"h2", "h1"} {
		for _, proto := range []string{"h1", "h2"} {
			t.Run("sandbox-"+proto+"/upstream-"+up, func(t *testing.T) {
				h := newHarness(t, ruleConfig(t))
				if up == "h1" {
					h.useH1Upstream()
				}
				h.secrets.set("TOKEN", tokenValue)
				h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					auth := r.Header.Get("Authorization")
					w.Header().Set("Link", "</style.css?k="+strings.TrimPrefix(auth, "Bearer ")+">; rel=preload")
					w.Header().Set("X-Early", auth)
					w.Header().Set("X-"+tokenValue, "1")
					w.WriteHeader(http.StatusEarlyHints)
					clear(w.Header())
					w.Header().Set("X-Final", auth)
					io.WriteString(w, "final "+auth)
				})
				resp, body, early := getWithInterim(t, h.client(proto), "https://api.test/early")
				if resp.StatusCode != 200 || body != "final Bearer ${e2b.secrets.TOKEN}" || resp.Header.Get("X-Final") != "Bearer ${e2b.secrets.TOKEN}" {
					t.Fatalf("final response %d %q %v", resp.StatusCode, body, resp.Header)
				}
				if len(early) != 1 || early[0].code != http.StatusEarlyHints {
					t.Fatalf("interim responses %+v, want one 103", early)
				}
				lower := strings.ToLower(tokenValue)
				for k, vs := range early[0].header {
					if strings.Contains(strings.ToLower(k), lower) || strings.Contains(strings.ToLower(strings.Join(vs, "\n")), lower) {
						t.Fatalf("the secret reached the sandbox in a 103: %q: %q", k, vs)
					}
				}
				if got := early[0].header.Get("X-Early"); got != "Bearer ${e2b.secrets.TOKEN}" {
					t.Errorf("103 X-Early %q, want the masked value", got)
				}
				if got := early[0].header.Get("Link"); got != "</style.css?k=${e2b.secrets.TOKEN}>; rel=preload" {
					t.Errorf("103 Link %q, want the masked value", got)
				}
			})
		}
	}
}

// encode applies codings to s in order, as Content-Encoding lists them.
func encode(t testing.TB, s string, codings ...string) []byte {
	b := []byte(s)
	for _, c := range codings {
		var out bytes.Buffer
		var w io.WriteCloser
		switch strings.ToLower(c) {
		case "gzip", "x-gzip":
			w = gzip.NewWriter(&out)
		case "deflate":
			w = zlib.NewWriter(&out)
		default: // identity, or one the gateway does not know: left as is
			out.Write(b)
			b = out.Bytes()
			continue
		}
		w.Write(b)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		b = out.Bytes()
	}
	return b
}

// reveal is what a sandbox can get out of a body: the body and every
// gzip or zlib layer it can peel off it, whatever the headers said.
func reveal(b []byte) string {
	var all strings.Builder
	all.Write(b)
	for range 16 {
		var r io.ReadCloser
		var err error
		if r, err = gzip.NewReader(bytes.NewReader(b)); err != nil {
			if r, err = zlib.NewReader(bytes.NewReader(b)); err != nil {
				break
			}
		}
		d, err := io.ReadAll(r)
		if len(d) == 0 {
			break
		}
		all.WriteString("\n")
		all.Write(d)
		b = d
		if err != nil {
			break
		}
	}
	return all.String()
}

// TestStackedContentCodingsDecodedOrRefused has a bound host echo the
// injected value under several Content-Encoding headers and lists: every
// coding is undone and the value masked, or the response is refused; the
// value never reaches the sandbox, whichever layer it sits under.
func TestStackedContentCodingsDecodedOrRefused(t *testing.T) {
	cases := []struct {
		lines  []string // Content-Encoding header lines, as sent
		apply  []string // codings applied to the body, in order
		refuse bool
	}{
		{lines: []string{"identity", "gzip"}, apply: []string{"gzip"}},
		{lines: []string{"gzip", "identity"}, apply: []string{"gzip"}},
		{lines: []string{"gzip", "gzip"}, apply: []string{"gzip", "gzip"}},
		{lines: []string{"gzip, gzip"}, apply: []string{"gzip", "gzip"}},
		{lines: []string{"gzip, identity"}, apply: []string{"gzip"}},
		{lines: []string{"GZIP", "X-Gzip"}, apply: []string{"gzip", "gzip"}},
		{lines: []string{" Deflate ,gzip,"}, apply: []string{"deflate", "gzip"}},
		{lines: []string{"gzip", "deflate"}, apply: []string{"gzip", "deflate"}},
		{lines: []string{"identity", "br"}, apply: nil, refuse: true},
		{lines: []string{"gzip", "br"}, apply: []string{"gzip"}, refuse: true},
		{lines: []string{"x-unknown, gzip"}, apply: []string{"gzip"}, refuse: true},
		{lines: []string{"gzip, gzip, gzip, gzip, gzip"}, apply: []string{"gzip", "gzip", "gzip", "gzip", "gzip"}, refuse: true},
	}
	for _, up := range []string{"h2", "h1"} {
		t.Run("upstream-"+up, func(t *testing.T) {
			h := newHarness(t, ruleConfig(t))
			if up == "h1" {
				h.useH1Upstream()
			}
			h.secrets.set("TOKEN", tokenValue)
			h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var i int
				fmt.Sscanf(r.URL.Path, "/case/%d", &i)
				w.Header()["Content-Encoding"] = cases[i].lines
				w.Write(encode(t, "token="+r.Header.Get("Authorization"), cases[i].apply...))
			})
			c := h.client("h1")
			for i, tc := range cases {
				resp, body := get(t, c, fmt.Sprintf("https://api.test/case/%d", i))
				if all := reveal([]byte(body)); strings.Contains(all, tokenValue) {
					t.Errorf("Content-Encoding %q: the secret reached the sandbox (status %d, encoding %q): %q", tc.lines, resp.StatusCode, resp.Header.Values("Content-Encoding"), all)
					continue
				}
				if tc.refuse {
					if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Fence-Gateway") != ReasonEncoding {
						t.Errorf("Content-Encoding %q: status %d %q, want 502 %s", tc.lines, resp.StatusCode, resp.Header.Get("X-Fence-Gateway"), ReasonEncoding)
					}
					continue
				}
				if resp.StatusCode != 200 || body != "token=Bearer ${e2b.secrets.TOKEN}" || len(resp.Header.Values("Content-Encoding")) != 0 {
					t.Errorf("Content-Encoding %q: status %d encoding %q body %q, want 200, decoded and masked", tc.lines, resp.StatusCode, resp.Header.Values("Content-Encoding"), body)
				}
			}
		})
	}
}

// TestTransferCodingRefused has an HTTP/1.1 upstream put the echo under a
// transfer coding other than chunked: the response is refused, so the
// value never reaches the sandbox.
func TestTransferCodingRefused(t *testing.T) {
	for _, te := range [][]string{{"gzip, chunked"}, {"gzip", "chunked"}, {"GZIP"}} {
		t.Run(strings.Join(te, "+"), func(t *testing.T) {
			h := newHarness(t, ruleConfig(t))
			h.useH1Upstream()
			h.secrets.set("TOKEN", tokenValue)
			h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c, brw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					return
				}
				defer c.Close()
				z := encode(t, "token="+r.Header.Get("Authorization"), "gzip")
				brw.WriteString("HTTP/1.1 200 OK\r\nConnection: close\r\n")
				for _, v := range te {
					brw.WriteString("Transfer-Encoding: " + v + "\r\n")
				}
				brw.WriteString("\r\n")
				if strings.HasSuffix(strings.ToLower(te[len(te)-1]), "chunked") {
					fmt.Fprintf(brw, "%x\r\n%s\r\n0\r\n\r\n", len(z), z)
				} else {
					brw.Write(z)
				}
				brw.Flush()
			})
			resp, body := get(t, h.client("h1"), "https://api.test/te")
			if all := reveal([]byte(body)); strings.Contains(all, tokenValue) {
				t.Fatalf("the secret reached the sandbox: %d %q", resp.StatusCode, all)
			}
			if resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d %q, want 502", resp.StatusCode, body)
			}
		})
	}
}

// TestInformationalResponsesMaskedForBinding: a bound host that echoes
// the value put in for a placeholder in a 103 shows the sandbox the
// placeholder.
func TestInformationalResponsesMaskedForBinding(t *testing.T) {
	h := newHarness(t, bindingConfig(t, PlaceHeader))
	h.secrets.set("TOKEN", tokenValue)
	h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Early", r.Header.Get("X-Key"))
		w.WriteHeader(http.StatusEarlyHints)
		clear(w.Header())
		io.WriteString(w, "ok")
	})
	c := h.client("h2")
	req, _ := http.NewRequest(http.MethodGet, "https://api.test/early", nil)
	req.Header.Set("X-Key", placeholder)
	var early []textproto.MIMEHeader
	req = req.WithContext(httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
			early = append(early, textproto.MIMEHeader(http.Header(h).Clone()))
			return nil
		}}))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if seen := h.seenHost("api.test"); len(seen) != 1 || seen[0].Header.Get("X-Key") != tokenValue {
		t.Fatalf("upstream saw %+v", seen)
	}
	if len(early) != 1 || early[0].Get("X-Early") != placeholder {
		t.Fatalf("103 headers %v, want X-Early with the placeholder", early)
	}
}
