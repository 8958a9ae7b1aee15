package gateway

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// keeper is a bound host that stores what it gets and serves it back, as
// blob stores and paste services do: /store keeps the request's
// Authorization line, /get serves it with http.ServeContent (ranges,
// multipart/byteranges, If-Range and all).
type keeper struct {
	mu   sync.Mutex
	kept string
}

func (k *keeper) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch r.URL.Path {
	case "/store":
		k.kept = "Authorization: " + r.Header.Get("Authorization") + "\n"
	case "/get":
		w.Header().Set("ETag", `"v1"`)
		http.ServeContent(w, r, "", time.Time{}, strings.NewReader(k.kept))
	}
}

// TestRangeCannotSplitMaskedValue: a sandbox that stored the injected
// value on a bound host reads it back in pieces of its choosing (two
// ranges, or one multipart/byteranges answer whose boundary splits the
// value). The gateway drops Range and If-Range on the way there, so the
// host answers whole, and masked.
func TestRangeCannotSplitMaskedValue(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h := newHarness(t, bindingConfig(t, PlaceHeader))
			h.secrets.set("TOKEN", tokenValue)
			h.handler = &keeper{}
			c := h.client(proto)
			if resp, _ := get(t, c, "https://api.test/store", "Authorization", "Bearer "+placeholder); resp.StatusCode != 200 {
				t.Fatalf("store: status %d", resp.StatusCode)
			}
			whole := "Authorization: Bearer " + placeholder + "\n"
			var pieces strings.Builder
			for _, rng := range []string{"bytes=0-27", "bytes=28-200", "bytes=0-27,28-200", "bytes=-10"} {
				resp, body := get(t, c, "https://api.test/get", "Range", rng, "If-Range", `"v1"`)
				pieces.WriteString(body)
				if resp.StatusCode != 200 || body != whole {
					t.Errorf("Range %s: status %d, body %q; want 200 and the whole masked body", rng, resp.StatusCode, body)
				}
			}
			if strings.Contains(pieces.String(), tokenValue[:8]) || strings.Contains(pieces.String(), tokenValue[8:]) {
				t.Errorf("pieces of the value reached the sandbox: %q", pieces.String())
			}
			for _, s := range h.seenHost("api.test") {
				if s.Header.Get("Range") != "" || s.Header.Get("If-Range") != "" {
					t.Errorf("upstream got Range %q If-Range %q", s.Header.Get("Range"), s.Header.Get("If-Range"))
				}
			}
		})
	}
}

// TestPartialAnswersRefused: a host whose answers are masked and that
// cuts its answer anyway (206, or multipart/byteranges under 200) is
// refused whole; a host whose answers are not masked passes them on.
func TestPartialAnswersRefused(t *testing.T) {
	h := newHarness(t, bindingConfig(t, PlaceHeader))
	h.secrets.set("TOKEN", tokenValue)
	h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/multipart" {
			w.Header().Set("Content-Type", "Multipart/ByteRanges; boundary=x")
			io.WriteString(w, "--x\r\nContent-Range: bytes 0-3/8\r\n\r\n"+tokenValue[:4]+"\r\n--x--\r\n")
			return
		}
		w.Header().Set("Content-Range", "bytes 0-3/8")
		w.WriteHeader(http.StatusPartialContent)
		io.WriteString(w, tokenValue[:4])
	})
	c := h.client("h2")
	for _, p := range []string{"/partial", "/multipart"} {
		resp, body := get(t, c, "https://api.test"+p)
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Fence-Gateway") != ReasonPartial || strings.Contains(body, tokenValue[:4]) {
			t.Errorf("%s: status %d %q %q; want 502 %s", p, resp.StatusCode, resp.Header.Get("X-Fence-Gateway"), body, ReasonPartial)
		}
		h.rec.waitEvent(t, func(ev Event) bool { return ev.Path == p && ev.Reason == ReasonPartial && !ev.Allowed })
	}
	if resp, _ := get(t, c, "https://other.test/partial"); resp.StatusCode != http.StatusPartialContent {
		t.Errorf("unbound host: status %d, want its 206", resp.StatusCode)
	}
}

// TestDigestsOfUnmaskedBodyDropped: the sandbox cannot ask a host whose
// answers are masked for a digest of the body before masking (which
// would check a guess of the value), and digest fields the host sends
// anyway, in the header or the trailer, are dropped.
func TestDigestsOfUnmaskedBodyDropped(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h := newHarness(t, bindingConfig(t, PlaceHeader))
			h.secrets.set("TOKEN", tokenValue)
			if proto == "h1" {
				h.useH1Upstream()
			}
			h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Trailer", "Content-Digest")
				for _, k := range []string{"Digest", "Repr-Digest", "Content-Md5"} {
					w.Header().Set(k, "sha-256=:digest-of-"+r.Header.Get("X-Key")+":")
				}
				io.WriteString(w, "key="+r.Header.Get("X-Key"))
				w.Header().Set("Content-Digest", "sha-256=:trailer-digest:")
				w.Header().Set(http.TrailerPrefix+"Repr-Digest", "sha-256=:undeclared:")
			})
			c := h.client(proto)
			resp, body := get(t, c, "https://api.test/x", "X-Key", placeholder,
				"Want-Digest", "sha-256", "Want-Repr-Digest", "sha-256=10", "Want-Content-Digest", "sha-256=10", "Accept-Encoding", "br")
			if body != "key="+placeholder {
				t.Errorf("body %q", body)
			}
			for _, hd := range []http.Header{resp.Header, resp.Trailer} {
				for _, k := range digestHeaders {
					if v := hd.Get(k); v != "" {
						t.Errorf("the sandbox got %s: %q", k, v)
					}
				}
			}
			seen := h.seenHost("api.test")
			if len(seen) != 1 {
				t.Fatalf("upstream saw %d requests", len(seen))
			}
			for _, k := range []string{"Want-Digest", "Want-Repr-Digest", "Want-Content-Digest"} {
				if v := seen[0].Header.Get(k); v != "" {
					t.Errorf("upstream got %s: %q", k, v)
				}
			}
			if v := seen[0].Header.Get("Accept-Encoding"); v != "identity" {
				t.Errorf("upstream got Accept-Encoding %q, want identity", v)
			}
		})
	}
}

// holdsValue reports whether a field name of h holds the value, in any
// case.
func holdsValue(h http.Header, v string) string {
	for k := range h {
		if strings.Contains(strings.ToLower(k), strings.ToLower(v)) {
			return k
		}
	}
	return ""
}

// TestHeaderNamesHoldingValueDropped: a bound host that makes a field
// name of the value it got (from the query, or from the injected
// Authorization) in the header, a declared trailer or an undeclared one
// hands the sandbox none of them; undeclared trailers' values are masked
// over an HTTP/1.1 upstream too.
func TestHeaderNamesHoldingValueDropped(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h := newHarness(t, bindingConfig(t, PlaceHeader|PlaceQuery))
			h.secrets.set("TOKEN", strings.ToLower(tokenValue))
			if proto == "h1" {
				h.useH1Upstream()
			}
			h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				q := r.URL.Query().Get("q")
				auth := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
				w.Header().Set("Trailer", "X-T-"+q)
				w.Header().Set("X-"+q, "1")
				w.Header().Set("X-Auth-"+auth, "1")
				w.Header().Set("X-Kept", "ok")
				io.WriteString(w, "ok")
				w.Header().Set("X-T-"+q, "1")
				w.Header().Set(http.TrailerPrefix+"X-U-"+auth, "1")
				w.Header().Set(http.TrailerPrefix+"X-Undeclared", q)
			})
			c := h.client(proto)
			resp, body := get(t, c, "https://api.test/names?q="+url.QueryEscape(placeholder), "Authorization", "Bearer "+placeholder)
			if seen := h.seenHost("api.test"); len(seen) != 1 || !strings.Contains(seen[0].URI, strings.ToLower(tokenValue)) {
				t.Fatalf("upstream saw %+v", seen)
			}
			v := strings.ToLower(tokenValue)
			if k := holdsValue(resp.Header, v); k != "" {
				t.Errorf("the sandbox got a header named %q", k)
			}
			if k := holdsValue(resp.Trailer, v); k != "" {
				t.Errorf("the sandbox got a trailer named %q", k)
			}
			if got := resp.Trailer.Get("X-Undeclared"); got != placeholder {
				t.Errorf("undeclared trailer %q, want the placeholder", got)
			}
			if body != "ok" || resp.Header.Get("X-Kept") != "ok" {
				t.Errorf("body %q, X-Kept %q", body, resp.Header.Get("X-Kept"))
			}
		})
	}
}

// TestSwitchingProtocolsHeaderNamesDropped: a 101's field named after
// the injected value is dropped too.
func TestSwitchingProtocolsHeaderNamesDropped(t *testing.T) {
	h := newHarness(t, bindingConfig(t, PlaceHeader))
	h.secrets.set("TOKEN", tokenValue)
	h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-" + r.Header.Get("X-Key") + ": 1\r\n\r\n")
		brw.Flush()
	})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.ca.CertPEM())
	raw, err := net.Dial("tcp", h.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	tc := tls.Client(raw, &tls.Config{ServerName: "api.test", RootCAs: pool, NextProtos: []string{"http/1.1"}})
	io.WriteString(tc, "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nX-Key: "+placeholder+"\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if k := holdsValue(resp.Header, tokenValue); k != "" {
		t.Errorf("the 101 has a field named %q", k)
	}
}

// TestBindingPorts: a binding without a port covers the scheme's port
// only (443 for https); one with a port covers that port only. A host
// the binding names is masked on every port all the same, and over plain
// HTTP.
func TestBindingPorts(t *testing.T) {
	send := func(t *testing.T, h *harness, port uint32) (*http.Response, string) {
		t.Helper()
		h.dstPort.Store(port)
		return get(t, h.client("h2"), "https://api.test/echo", "Authorization", "Bearer "+placeholder)
	}
	t.Run("default 443", func(t *testing.T) {
		h := newHarness(t, bindingConfig(t, PlaceHeader))
		h.secrets.set("TOKEN", tokenValue)
		if resp, body := send(t, h, 443); resp.StatusCode != 200 || !strings.Contains(body, "Authorization: Bearer "+placeholder) {
			t.Fatalf("port 443: %d %q", resp.StatusCode, body)
		}
		if resp, body := send(t, h, 8443); resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Fence-Gateway") != ReasonPlaceholderLeak {
			t.Errorf("port 8443: %d %q, want 403 %s", resp.StatusCode, body, ReasonPlaceholderLeak)
		}
		for _, s := range h.seenRequests() {
			if strings.Contains(s.Header.Get("Authorization"), placeholder) {
				t.Errorf("upstream got the placeholder: %+v", s)
			}
		}
		if n := len(h.seenRequests()); n != 1 {
			t.Errorf("upstream saw %d requests, want the one on 443", n)
		}
	})
	t.Run("explicit port", func(t *testing.T) {
		cfg := bindingConfig(t, PlaceHeader)
		cfg.Bindings[0].Hosts = []string{"api.test:8443"}
		h := newHarness(t, cfg)
		h.secrets.set("TOKEN", tokenValue)
		if resp, body := send(t, h, 8443); resp.StatusCode != 200 || !strings.Contains(body, "Authorization: Bearer "+placeholder) {
			t.Fatalf("port 8443: %d %q", resp.StatusCode, body)
		}
		if seen := h.seenRequests(); len(seen) != 1 || seen[0].Header.Get("Authorization") != "Bearer "+tokenValue {
			t.Fatalf("upstream saw %+v", seen)
		}
		if resp, _ := send(t, h, 443); resp.StatusCode != http.StatusForbidden {
			t.Errorf("port 443: %d, want 403", resp.StatusCode)
		}
	})
	t.Run("masked on every port and over http", func(t *testing.T) {
		h := newHarness(t, bindingConfig(t, PlaceHeader))
		h.secrets.set("TOKEN", tokenValue)
		h.handler = &keeper{}
		c := h.client("h2")
		if resp, _ := get(t, c, "https://api.test/store", "Authorization", "Bearer "+placeholder); resp.StatusCode != 200 {
			t.Fatalf("store: %d", resp.StatusCode)
		}
		h.dstPort.Store(8443)
		if _, body := get(t, h.client("h2"), "https://api.test/get"); body != "Authorization: Bearer "+placeholder+"\n" {
			t.Errorf("read back on 8443: %q", body)
		}
		if _, body := get(t, h.client("h1"), "http://api.test/get"); body != "Authorization: Bearer "+placeholder+"\n" {
			t.Errorf("read back over plain HTTP: %q", body)
		}
	})
}

func TestSplitBindingHost(t *testing.T) {
	for in, want := range map[string]struct {
		pattern string
		port    uint16
		ok      bool
	}{
		"api.test":          {"api.test", 0, true},
		" API.test:8443 ":   {"api.test", 8443, true},
		"*.cdn.test:443":    {"*.cdn.test", 443, true},
		"api.test:0":        {"", 0, false},
		"api.test:65536":    {"", 0, false},
		"api.test:":         {"", 0, false},
		"api.test:80,443":   {"", 0, false},
		"*":                 {"", 0, false},
		"*:443":             {"", 0, false},
		"10.0.0.1:443":      {"", 0, false},
		"api.test:443:8443": {"", 0, false},
	} {
		p, port, ok := splitBindingHost(in)
		if p != want.pattern || port != want.port || ok != want.ok {
			t.Errorf("splitBindingHost(%q) = %q %d %v, want %+v", in, p, port, ok, want)
		}
	}
}

// TestUndeclaredTrailerMasked: an HTTP/1.1 upstream that announced no
// trailer and sends one holding the value shows the sandbox the
// placeholder (the transport makes the trailer map only at the body's
// end).
func TestUndeclaredTrailerMasked(t *testing.T) {
	h := newHarness(t, bindingConfig(t, PlaceHeader))
	h.secrets.set("TOKEN", tokenValue)
	h.useH1Upstream()
	h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
		w.(http.Flusher).Flush()
		w.Header().Set(http.TrailerPrefix+"X-Late", r.Header.Get("X-Key"))
	})
	resp, _ := get(t, h.client("h1"), "https://api.test/late", "X-Key", placeholder)
	if got := resp.Trailer.Get("X-Late"); got != placeholder {
		t.Errorf("undeclared trailer %q, want the placeholder", got)
	}
}

// TestValueSplitAcrossFlushesMasked: a host that sends the value in two
// flushes, the second after a pause, is masked whole: the gateway holds
// the first half back until it knows what follows.
func TestValueSplitAcrossFlushesMasked(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h := newHarness(t, bindingConfig(t, PlaceHeader))
			h.secrets.set("TOKEN", tokenValue)
			h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				v := r.Header.Get("X-Key")
				io.WriteString(w, "a "+v[:7])
				w.(http.Flusher).Flush()
				time.Sleep(100 * time.Millisecond)
				io.WriteString(w, v[7:]+" b")
			})
			_, body := get(t, h.client(proto), "https://api.test/split", "X-Key", placeholder)
			if body != "a "+placeholder+" b" {
				t.Errorf("body %q, want the placeholder whole", body)
			}
		})
	}
}
