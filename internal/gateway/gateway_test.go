package gateway

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"testing"
	"time"
)

const (
	tokenValue  = "s3cr3t-VALUE-0123456789"
	placeholder = "e2b_ph_7f3a9c1d2b4e6f80a1b2c3d4"
)

func ruleConfig(t testing.TB) *Config {
	return &Config{
		Policy: allowAll(t),
		Rules: map[string]map[string]string{
			"api.test":    {"Authorization": "Bearer ${e2b.secrets.TOKEN}"},
			"*.wild.test": {"X-Api-Key": "${e2b.secrets.TOKEN}", "X-Plain": "v1"},
		},
	}
}

func bindingConfig(t testing.TB, places Place) *Config {
	return &Config{
		Policy: allowAll(t),
		Bindings: []Binding{{
			Env: "API_TOKEN", Secret: "TOKEN", Placeholder: placeholder,
			Hosts: []string{"api.test"}, Places: places,
		}},
	}
}

func TestRuleInjectsSecretAndMasksEcho(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h := newHarness(t, ruleConfig(t))
			h.secrets.set("TOKEN", tokenValue)
			resp, body := get(t, h.client(proto), "https://api.test/echo", "Accept-Encoding", "gzip")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if want := "HTTP/" + map[string]string{"h1": "1.1", "h2": "2.0"}[proto]; resp.Proto != want {
				t.Errorf("client spoke %s, want %s", resp.Proto, want)
			}
			seen := h.seenHost("api.test")
			if len(seen) != 1 || seen[0].Header.Get("Authorization") != "Bearer "+tokenValue {
				t.Fatalf("upstream saw %+v", seen)
			}
			if seen[0].Proto != "HTTP/2.0" {
				t.Errorf("upstream spoke %s, want HTTP/2.0", seen[0].Proto)
			}
			if seen[0].Header.Get("Accept-Encoding") != "identity" {
				t.Errorf("upstream saw Accept-Encoding %q on a request with an injected value", seen[0].Header.Get("Accept-Encoding"))
			}
			if strings.Contains(body, tokenValue) || strings.Contains(resp.Header.Get("X-Echo-Authorization"), tokenValue) {
				t.Fatalf("the secret reached the sandbox: %q / %q", body, resp.Header.Get("X-Echo-Authorization"))
			}
			if !strings.Contains(body, "Authorization: Bearer ${e2b.secrets.TOKEN}") {
				t.Errorf("echo not masked as expected: %q", body)
			}
			ev := h.rec.waitEvent(t, func(ev Event) bool { return ev.Host == "api.test" })
			if !ev.Allowed || ev.Status != 200 || len(ev.Secrets) != 1 || ev.Secrets[0] != "TOKEN" || ev.Path != "/echo" || ev.BytesIn == 0 {
				t.Errorf("event %+v", ev)
			}
		})
	}
}

func TestRuleWildcardAndPlainValue(t *testing.T) {
	h := newHarness(t, ruleConfig(t))
	h.secrets.set("TOKEN", tokenValue)
	resp, body := get(t, h.client("h2"), "https://a.b.wild.test/echo", "X-Plain", "from-sandbox")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	seen := h.seenHost("a.b.wild.test")
	if len(seen) != 1 || seen[0].Header.Get("X-Api-Key") != tokenValue || seen[0].Header.Get("X-Plain") != "v1" {
		t.Fatalf("upstream saw %+v", seen)
	}
	if strings.Contains(body, tokenValue) {
		t.Fatal("secret in response")
	}
}

func TestMissingSecretRefused(t *testing.T) {
	h := newHarness(t, ruleConfig(t))
	resp, _ := get(t, h.client("h1"), "https://api.test/echo")
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	if n := len(h.seenHost("api.test")); n != 0 {
		t.Fatalf("upstream got %d requests", n)
	}
	ev := h.rec.waitEvent(t, func(ev Event) bool { return ev.Reason == ReasonSecretMissing })
	if ev.Allowed || len(ev.Secrets) != 1 || ev.Secrets[0] != "TOKEN" {
		t.Errorf("event %+v", ev)
	}
}

func TestCompressedEchoIsDecodedAndMasked(t *testing.T) {
	h := newHarness(t, ruleConfig(t))
	h.secrets.set("TOKEN", tokenValue)
	h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A server that compresses whatever the client asked for.
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		io.WriteString(zw, "token="+r.Header.Get("Authorization"))
		zw.Close()
	})
	resp, body := get(t, h.client("h1"), "https://api.test/x")
	if resp.StatusCode != 200 || strings.Contains(body, tokenValue) || body != "token=Bearer ${e2b.secrets.TOKEN}" {
		t.Fatalf("status %d body %q encoding %q", resp.StatusCode, body, resp.Header.Get("Content-Encoding"))
	}
	h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "br")
		io.WriteString(w, "opaque "+r.Header.Get("Authorization"))
	})
	resp, body = get(t, h.client("h1"), "https://api.test/y")
	if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, tokenValue) {
		t.Fatalf("brotli answer passed: %d %q", resp.StatusCode, body)
	}
	h.rec.waitEvent(t, func(ev Event) bool { return ev.Reason == ReasonEncoding })
}

func TestRotationBetweenRequestsOnOneConnection(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h := newHarness(t, ruleConfig(t))
			c := h.client(proto)
			h.secrets.set("TOKEN", "first-value-aaaa")
			get(t, c, "https://api.test/1")
			h.secrets.set("TOKEN", "second-value-bbbb")
			reused := false
			req, _ := http.NewRequest("GET", "https://api.test/2", nil)
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
				GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
			}))
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if !reused {
				t.Fatal("second request did not reuse the connection")
			}
			seen := h.seenHost("api.test")
			if len(seen) != 2 || seen[0].Header.Get("Authorization") != "Bearer first-value-aaaa" || seen[1].Header.Get("Authorization") != "Bearer second-value-bbbb" {
				t.Fatalf("upstream saw %+v", seen)
			}
			if h.served.Load() != 1 {
				t.Errorf("%d intercepted connections, want 1", h.served.Load())
			}
		})
	}
}

func TestBindingHeaderReplacedAndMasked(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h := newHarness(t, bindingConfig(t, PlaceHeader))
			h.secrets.set("TOKEN", tokenValue)
			resp, body := get(t, h.client(proto), "https://api.test/echo", "Authorization", "Bearer "+placeholder, "Cookie", "s="+placeholder)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d %s", resp.StatusCode, body)
			}
			seen := h.seenHost("api.test")
			if len(seen) != 1 || seen[0].Header.Get("Authorization") != "Bearer "+tokenValue || seen[0].Header.Get("Cookie") != "s="+tokenValue {
				t.Fatalf("upstream saw %+v", seen)
			}
			if strings.Contains(body, tokenValue) || strings.Contains(resp.Header.Get("X-Echo-Authorization"), tokenValue) {
				t.Fatalf("secret reached the sandbox: %q", body)
			}
			if resp.Header.Get("X-Echo-Authorization") != "Bearer "+placeholder {
				t.Errorf("echoed header %q, want the placeholder", resp.Header.Get("X-Echo-Authorization"))
			}
		})
	}
}

// refusedLeak sends a request and checks it is refused as a placeholder
// leak, and that upstream never saw the placeholder.
func refusedLeak(t *testing.T, h *harness, c *http.Client, req *http.Request) {
	t.Helper()
	resp, err := c.Do(req)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("%s %s: status %d, want 403", req.Method, req.URL, resp.StatusCode)
		}
	}
	h.rec.waitEvent(t, func(ev Event) bool {
		return ev.Reason == ReasonPlaceholderLeak && len(ev.Secrets) == 1 && ev.Secrets[0] == "TOKEN" && !ev.Allowed
	})
	for _, s := range h.seenRequests() {
		all := s.URI + string(s.Body)
		for k, vs := range s.Header {
			all += k + strings.Join(vs, "")
		}
		if strings.Contains(all, placeholder) || strings.Contains(all, tokenValue) {
			t.Fatalf("upstream saw the placeholder or value: %+v", s)
		}
	}
}

func TestPlaceholderLeaksRefused(t *testing.T) {
	cases := []struct {
		name   string
		places Place
		req    func() *http.Request
	}{
		{"path", PlaceHeader | PlaceQuery, func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.test/v1/"+placeholder, nil)
			return r
		}},
		{"path-escaped", PlaceHeader | PlaceQuery, func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.test/v1/%65"+placeholder[1:], nil)
			return r
		}},
		{"query-not-allowed", PlaceHeader, func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.test/v1?key="+placeholder, nil)
			return r
		}},
		{"query-key", PlaceQuery, func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.test/v1?"+placeholder+"=1", nil)
			return r
		}},
		{"header-not-allowed", PlaceQuery, func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.test/v1", nil)
			r.Header.Set("X-Key", placeholder)
			return r
		}},
		{"unbound-host-header", PlaceHeader, func() *http.Request {
			r, _ := http.NewRequest("GET", "https://other.test/v1", nil)
			r.Header.Set("Authorization", "Bearer "+placeholder)
			return r
		}},
		{"unbound-host-basic", PlaceBasicAuth | PlaceHeader, func() *http.Request {
			r, _ := http.NewRequest("GET", "https://other.test/v1", nil)
			r.SetBasicAuth("user", placeholder)
			return r
		}},
		{"body", PlaceHeader | PlaceQuery | PlaceBasicAuth, func() *http.Request {
			r, _ := http.NewRequest("POST", "https://api.test/v1", strings.NewReader(`{"token":"`+placeholder+`"}`))
			return r
		}},
		{"body-unbound-host", PlaceHeader, func() *http.Request {
			r, _ := http.NewRequest("POST", "https://other.test/v1", strings.NewReader("k="+placeholder))
			return r
		}},
	}
	for _, tc := range cases {
		for _, proto := range []string{"h1", "h2"} {
			t.Run(tc.name+"/"+proto, func(t *testing.T) {
				h := newHarness(t, bindingConfig(t, tc.places))
				h.secrets.set("TOKEN", tokenValue)
				refusedLeak(t, h, h.client(proto), tc.req())
			})
		}
	}
}

func TestBindingQueryAndBasicAuth(t *testing.T) {
	h := newHarness(t, bindingConfig(t, PlaceQuery|PlaceBasicAuth))
	h.secrets.set("TOKEN", tokenValue)
	c := h.client("h2")
	resp, body := get(t, c, "https://api.test/echo?a=1&key="+placeholder+"&z=%2F")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d %s", resp.StatusCode, body)
	}
	seen := h.seenHost("api.test")
	if len(seen) != 1 || !strings.HasSuffix(seen[0].URI, "?a=1&key="+url.QueryEscape(tokenValue)+"&z=%2F") {
		t.Fatalf("upstream saw %+v", seen)
	}
	if strings.Contains(body, tokenValue) || strings.Contains(resp.Header.Get("X-Echo-Query"), tokenValue) {
		t.Fatalf("value echoed unmasked: %q %q", body, resp.Header.Get("X-Echo-Query"))
	}

	req, _ := http.NewRequest("GET", "https://api.test/echo", nil)
	req.SetBasicAuth("user", placeholder)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("basic: status %d", resp.StatusCode)
	}
	seen = h.seenHost("api.test")
	u, p, ok := (&http.Request{Header: seen[1].Header}).BasicAuth()
	if !ok || u != "user" || p != tokenValue {
		t.Fatalf("upstream basic auth %q %q", u, p)
	}
	real := base64.StdEncoding.EncodeToString([]byte("user:" + tokenValue))
	if strings.Contains(string(b), real) || strings.Contains(resp.Header.Get("X-Echo-Authorization"), real) || strings.Contains(string(b), tokenValue) {
		t.Fatalf("basic credentials echoed unmasked: %q", b)
	}
}

func TestBindingOverPlainHTTPRefused(t *testing.T) {
	h := newHarness(t, bindingConfig(t, PlaceHeader))
	h.secrets.set("TOKEN", tokenValue)
	resp, _ := get(t, h.client("h1"), "http://api.test/echo", "Authorization", "Bearer "+placeholder)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("status %d", resp.StatusCode)
	}
	h.rec.waitEvent(t, func(ev Event) bool { return ev.Reason == ReasonSecretPlainHTTP })
	if len(h.seenRequests()) != 0 {
		t.Fatal("upstream got a request")
	}
}

func TestRedirectToOtherHostCarryingPlaceholder(t *testing.T) {
	h := newHarness(t, bindingConfig(t, PlaceQuery))
	h.secrets.set("TOKEN", tokenValue)
	c := h.client("h2")
	to := "https://other.test/collect?k=" + placeholder
	// The gateway hands the 302 back; the client follows it itself.
	var hops []string
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		hops = append(hops, req.URL.Host)
		return nil
	}
	resp, err := c.Get("https://api.test/redirect?to=" + url.QueryEscape(to) + "&k=" + placeholder)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if len(hops) != 1 || hops[0] != "other.test" {
		t.Fatalf("redirect hops %v: the gateway must not follow redirects", hops)
	}
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("follow-up status %d, want 403", resp.StatusCode)
	}
	if n := len(h.seenHost("other.test")); n != 0 {
		t.Fatalf("other.test got %d requests", n)
	}
	h.rec.waitEvent(t, func(ev Event) bool { return ev.Host == "other.test" && ev.Reason == ReasonPlaceholderLeak })
	if s := h.seenHost("api.test"); len(s) != 1 || !strings.Contains(s[0].URI, url.QueryEscape(tokenValue)) {
		t.Fatalf("bound request %+v", s)
	}
}

func TestHostMismatchRefused(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h := newHarness(t, &Config{Policy: allowAll(t), Inspect: true})
			c := h.client(proto)
			c.Transport.(*http.Transport).TLSClientConfig.ServerName = "api.test"
			// SNI api.test, Host (h1) or :authority (h2) other.test.
			resp, body := get(t, c, "https://other.test/x")
			if resp.StatusCode != http.StatusMisdirectedRequest {
				t.Fatalf("status %d %q, want 421", resp.StatusCode, body)
			}
			// And a second request on the same connection naming the
			// right host still works (each request decided on its own).
			resp, _ = get(t, c, "https://api.test/x")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if n := len(h.seenHost("other.test")); n != 0 {
				t.Fatalf("other.test got %d requests", n)
			}
			h.rec.waitEvent(t, func(ev Event) bool { return ev.Reason == ReasonHostMismatch && ev.Host == "other.test" })
		})
	}
}

func TestPolicyDecidedPerRequest(t *testing.T) {
	h := newHarness(t, &Config{Policy: allowNames(t, "api.test"), Inspect: true})
	c := h.client("h2")
	if resp, _ := get(t, c, "https://api.test/x"); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// The policy changes; the open connection's next request is denied.
	h.cfg.Store(&Config{Policy: allowNames(t, "other.test"), Inspect: true})
	if resp, _ := get(t, c, "https://api.test/x"); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("status %d, want 403", resp.StatusCode)
	}
	h.rec.waitEvent(t, func(ev Event) bool { return strings.HasPrefix(ev.Reason, ReasonPolicy+":") })
}

func TestPlainHTTP(t *testing.T) {
	h := newHarness(t, &Config{
		Policy: allowNames(t, "api.test", "other.test"),
		Rules: map[string]map[string]string{
			"api.test":   {"X-Plain": "v1"},
			"other.test": {"Authorization": "${e2b.secrets.TOKEN}"},
		},
	})
	h.secrets.set("TOKEN", tokenValue)
	c := h.client("h1")
	resp, _ := get(t, c, "http://api.test/echo")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if s := h.seenHost("api.test"); len(s) != 1 || s[0].Header.Get("X-Plain") != "v1" {
		t.Fatalf("upstream saw %+v", s)
	}
	// Same connection, another Host that the destination was not handed
	// out for: refused.
	resp, _ = get(t, c, "http://api.test/echo", "Host", "other.test")
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("status %d, want 403", resp.StatusCode)
	}
	// An IP literal on a flow admitted by name.
	resp, _ = get(t, c, "http://api.test/echo", "Host", fakeDst.Addr().String())
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("IP literal: status %d, want 403", resp.StatusCode)
	}
	h.rec.waitEvent(t, func(ev Event) bool { return ev.Reason == ReasonIPLiteral })
	// A rule with a secret never applies in clear.
	resp, _ = get(t, h.client("h1"), "http://other.test/echo")
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("secret over http: status %d", resp.StatusCode)
	}
	if len(h.seenHost("other.test")) != 0 {
		t.Fatal("secret-carrying rule request reached upstream over plain HTTP")
	}
}

func TestUntrustedUpstreamGetsNoRequest(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h := newHarness(t, &Config{Policy: allowAll(t), Inspect: true})
			resp, _ := get(t, h.client(proto), "https://untrusted.test/x")
			if resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d, want 502", resp.StatusCode)
			}
			if n := len(h.seenRequests()); n != 0 {
				t.Fatalf("untrusted upstream got %d requests", n)
			}
			h.rec.waitEvent(t, func(ev Event) bool { return ev.Reason == ReasonUpstreamTLS })
		})
	}
}

func TestInterceptDecisions(t *testing.T) {
	pol := allowAll(t)
	cases := []struct {
		cfg        *Config
		name       string
		tls, plain bool
	}{
		{&Config{Policy: pol}, "example.com", false, false},
		{&Config{Policy: pol}, "files.pythonhosted.org", true, true},
		{&Config{Policy: pol}, "deb.debian.org", true, true},
		{&Config{Policy: pol}, "eu.archive.ubuntu.com", true, true},
		{&Config{Policy: pol, Passthrough: []string{"*.pythonhosted.org"}}, "files.pythonhosted.org", false, false},
		{&Config{Policy: pol, Inspect: true}, "example.com", true, true},
		{&Config{Policy: pol, Inspect: true, Passthrough: []string{"example.com"}}, "example.com", false, false},
		{&Config{Policy: pol, Inspect: true, Passthrough: []string{"example.com"}}, "EXAMPLE.com.", false, false},
		{ruleConfig(t), "api.test", true, true},
		{ruleConfig(t), "x.wild.test", true, true},
		{ruleConfig(t), "wild.test", false, false},
		{bindingConfig(t, PlaceHeader), "anything.example", true, true},
		{&Config{Policy: pol, Bindings: bindingConfig(t, PlaceHeader).Bindings, Passthrough: []string{"pinned.example"}}, "pinned.example", false, false},
		{nil, "api.test", false, false},
		{&Config{Inspect: true}, "api.test", false, false},
	}
	gw, err := New(Options{CA: newCAForTest(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		ic := gw.ForSandbox("s", func() *Config { return tc.cfg })
		if got := ic.InterceptTLS(tc.name); got != tc.tls {
			t.Errorf("InterceptTLS(%q) with %+v = %v", tc.name, tc.cfg, got)
		}
		if got := ic.InterceptHTTP(tc.name + ":80"); got != tc.plain {
			t.Errorf("InterceptHTTP(%q) with %+v = %v", tc.name, tc.cfg, got)
		}
	}
}

func TestWebSocketUpgradePasses(t *testing.T) {
	h := newHarness(t, bindingConfig(t, PlaceHeader))
	h.secrets.set("TOKEN", tokenValue)
	h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" || r.Header.Get("Authorization") != "Bearer "+tokenValue {
			http.Error(w, "bad upgrade", 400)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw) // echo
	})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.ca.CertPEM())
	raw, err := net.Dial("tcp", h.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	tc := tls.Client(raw, &tls.Config{ServerName: "api.test", RootCAs: pool, NextProtos: []string{"http/1.1"}})
	io.WriteString(tc, "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer "+placeholder+"\r\n\r\n")
	br := bufio.NewReader(tc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d %s", resp.StatusCode, b)
	}
	io.WriteString(tc, "hello over the upgraded connection")
	got := make([]byte, len("hello over the upgraded connection"))
	tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "hello over the upgraded connection" {
		t.Fatalf("echo %q %v", got, err)
	}
}

// TestBodyPlaceholderSplitAcrossWrites sends a body whose placeholder is
// split over two writes far apart in time: the gateway must hold back the
// first half and abort the upload before any of the placeholder leaves.
func TestBodyPlaceholderSplitAcrossWrites(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h := newHarness(t, bindingConfig(t, PlaceHeader))
			h.secrets.set("TOKEN", tokenValue)
			pr, pw := io.Pipe()
			req, _ := http.NewRequest("POST", "https://api.test/upload", pr)
			go func() {
				pw.Write(bytes.Repeat([]byte("x"), 100<<10))
				pw.Write([]byte(placeholder[:10]))
				time.Sleep(200 * time.Millisecond)
				pw.Write([]byte(placeholder[10:]))
				pw.Write(bytes.Repeat([]byte("y"), 1000))
				pw.Close()
			}()
			resp, err := h.client(proto).Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusForbidden {
					t.Fatalf("status %d, want 403", resp.StatusCode)
				}
			}
			h.rec.waitEvent(t, func(ev Event) bool { return ev.Reason == ReasonPlaceholderLeak })
			var partial []byte
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if s := h.seenHost("api.test"); len(s) > 0 {
					partial = s[0].Body
					break
				}
				if time.Now().After(deadline) {
					t.Log("upstream saw no request at all")
					break
				}
			}
			if bytes.Contains(partial, []byte(placeholder[:10])) {
				t.Fatalf("upstream received the start of the placeholder (%d bytes)", len(partial))
			}
			if len(partial) > 100<<10 {
				t.Fatalf("upstream received %d bytes, more than the prefix", len(partial))
			}
		})
	}
}

func TestDownloadsRecorded(t *testing.T) {
	cases := []struct {
		url                string
		eco, name, version string
	}{
		{"https://files.pythonhosted.org/packages/ab/cd/ef/requests-2.32.3-py3-none-any.whl", "pypi", "requests", "2.32.3"},
		{"https://files.pythonhosted.org/packages/ab/cd/ef/Python_Dateutil-2.9.0.tar.gz", "pypi", "python-dateutil", "2.9.0"},
		{"https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz", "npm", "left-pad", "1.3.0"},
		{"https://registry.npmjs.org/@types/node/-/node-20.11.5.tgz", "npm", "@types/node", "20.11.5"},
		{"http://deb.debian.org/debian/pool/main/c/curl/curl_7.88.1-10%2bdeb12u8_amd64.deb", "debian", "curl", "7.88.1-10+deb12u8"},
		{"https://deb.debian.org/debian/pool/main/s/systemd/libudev1_1%3a252.33-1_amd64.deb", "debian", "libudev1", "1:252.33-1"},
		{"https://proxy.golang.org/github.com/!burnt!sushi/toml/@v/v1.3.2.zip", "go", "github.com/BurntSushi/toml", "v1.3.2"},
		{"https://static.crates.io/crates/serde/serde-1.0.200.crate", "crates", "serde", "1.0.200"},
		{"https://crates.io/api/v1/crates/rand/0.8.5/download", "crates", "rand", "0.8.5"},
		{"https://github.com/cli/cli/releases/download/v2.50.0/gh_2.50.0_linux_amd64.tar.gz", "github", "cli/cli", "v2.50.0"},
	}
	h := newHarness(t, &Config{Policy: allowAll(t)})
	c := h.client("h2")
	for _, tc := range cases {
		resp, body := get(t, c, tc.url)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", tc.url, resp.StatusCode)
		}
		u, _ := url.Parse(tc.url)
		want := artifactBody(u.Host + u.Path)
		if body != string(want) {
			t.Fatalf("%s: body differs", tc.url)
		}
	}
	// Not artifacts: an index page and a HEAD.
	get(t, c, "https://pypi.org/simple/requests/")
	ds := h.rec.waitDownloads(t, len(cases))
	time.Sleep(50 * time.Millisecond)
	if len(h.rec.downloads) != len(cases) {
		t.Fatalf("%d downloads recorded, want %d", len(h.rec.downloads), len(cases))
	}
	for i, tc := range cases {
		d := ds[i]
		u, _ := url.Parse(tc.url)
		want := artifactBody(u.Host + u.Path)
		if d.Ecosystem != tc.eco || d.Name != tc.name || d.Version != tc.version || d.Size != int64(len(want)) || d.SHA256 != sha(want) || d.SandboxID != "sbx-test" || d.URL != tc.url {
			t.Errorf("%s: recorded %+v", tc.url, d)
		}
	}
}

func TestDownloadAfterRedirectAndCutShort(t *testing.T) {
	h := newHarness(t, &Config{Policy: allowAll(t)})
	h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Host == "github.com":
			w.Header().Set("Location", "https://release-assets.githubusercontent.com/asset/123?sig=abc&exp=1")
			w.WriteHeader(http.StatusFound)
		case r.URL.Path == "/asset/123":
			w.Write(artifactBody("asset"))
		case r.URL.Path == "/crates/cut/cut-1.0.0.crate":
			w.Header().Set("Content-Length", "1000000")
			w.Write([]byte("short"))
		}
	})
	c := h.client("h1")
	resp, body := get(t, c, "https://github.com/o/r/releases/download/v1.0/tool.tar.gz")
	if resp.StatusCode != 200 || body != string(artifactBody("asset")) {
		t.Fatalf("status %d", resp.StatusCode)
	}
	ds := h.rec.waitDownloads(t, 1)
	if d := ds[0]; d.Ecosystem != "github" || d.Name != "o/r" || d.Version != "v1.0" || d.SHA256 != sha(artifactBody("asset")) || d.URL != "https://github.com/o/r/releases/download/v1.0/tool.tar.gz" {
		t.Fatalf("recorded %+v", d)
	}
	// A body cut short is not a download.
	r2, err := c.Get("https://static.crates.io/crates/cut/cut-1.0.0.crate")
	if err == nil {
		io.Copy(io.Discard, r2.Body)
		r2.Body.Close()
	}
	h.rec.waitEvent(t, func(ev Event) bool { return ev.Path == "/crates/cut/cut-1.0.0.crate" })
	time.Sleep(50 * time.Millisecond)
	if n := len(h.rec.waitDownloads(t, 1)); n != 1 {
		t.Fatalf("%d downloads, the cut one was recorded", n)
	}
}

func TestServeEndsWithContext(t *testing.T) {
	h := newHarness(t, &Config{Policy: allowAll(t), Inspect: true})
	a, b := net.Pipe()
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		h.ic.Serve(ctx, egressFlow(a, h))
		close(done)
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
}

// TestBoundHostEchoLaterIsMasked: a bound host that keeps the value from
// one request and hands it back on another (which carried no
// placeholder) must not reveal it.
func TestBoundHostEchoLaterIsMasked(t *testing.T) {
	h := newHarness(t, bindingConfig(t, PlaceHeader))
	h.secrets.set("TOKEN", tokenValue)
	var kept string
	h.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("X-Note"); v != "" {
			kept = v
			return
		}
		w.Header().Set("X-Kept", kept)
		io.WriteString(w, "note="+kept)
	})
	c := h.client("h2")
	if resp, _ := get(t, c, "https://api.test/notes", "X-Note", placeholder); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if kept != tokenValue {
		t.Fatalf("upstream kept %q", kept)
	}
	resp, body := get(t, c, "https://api.test/notes")
	if strings.Contains(body, tokenValue) || strings.Contains(resp.Header.Get("X-Kept"), tokenValue) {
		t.Fatalf("value handed back unmasked: %q", body)
	}
	if body != "note="+placeholder {
		t.Errorf("body %q", body)
	}
}

func TestUpgradeOtherThanWebSocketRefused(t *testing.T) {
	h := newHarness(t, &Config{Policy: allowNames(t, "api.test"), Inspect: true})
	resp, _ := get(t, h.client("h1"), "http://api.test/", "Upgrade", "h2c", "Connection", "Upgrade, HTTP2-Settings", "HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if len(h.seenRequests()) != 0 {
		t.Fatal("h2c upgrade reached upstream")
	}
}

// TestConnectionEndClosesUpstream: when the sandbox's connection ends,
// Serve returns and every upstream connection it opened is closed.
func TestConnectionEndClosesUpstream(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h := newHarness(t, &Config{Policy: allowAll(t), Inspect: true})
			c := h.client(proto)
			// Concurrent requests make an HTTP/1.1 gateway open several
			// upstream connections.
			done := make(chan struct{})
			for i := 0; i < 4; i++ {
				go func() {
					defer func() { done <- struct{}{} }()
					resp, err := c.Get("https://api.test/x")
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}()
			}
			for i := 0; i < 4; i++ {
				<-done
			}
			if h.upOpen.Load() == 0 {
				t.Fatal("no upstream connection open while the sandbox's are")
			}
			deadline := time.Now().Add(5 * time.Second)
			for h.finished.Load() != h.served.Load() || h.upOpen.Load() != 0 {
				// Again each time: a connection the client was still
				// dialing when the requests ended joins its pool later.
				c.Transport.(*http.Transport).CloseIdleConnections()
				if time.Now().After(deadline) {
					t.Fatalf("served %d, returned %d, upstream still open %d", h.served.Load(), h.finished.Load(), h.upOpen.Load())
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

func TestHTTP2SandboxToHTTP1Upstream(t *testing.T) {
	h := newHarness(t, ruleConfig(t))
	h.useH1Upstream()
	h.secrets.set("TOKEN", tokenValue)
	c := h.client("h2")
	for i := 0; i < 3; i++ {
		resp, body := get(t, c, "https://api.test/echo")
		if resp.StatusCode != 200 || resp.Proto != "HTTP/2.0" || strings.Contains(body, tokenValue) {
			t.Fatalf("status %d proto %s", resp.StatusCode, resp.Proto)
		}
	}
	seen := h.seenHost("api.test")
	if len(seen) != 3 || seen[0].Proto != "HTTP/1.1" || seen[2].Header.Get("Authorization") != "Bearer "+tokenValue {
		t.Fatalf("upstream saw %+v", seen)
	}
}

func TestRuleForPrecedence(t *testing.T) {
	rules := map[string]map[string]string{
		"api.example.com":     {"k": "exact"},
		"*.example.com":       {"k": "wild"},
		"*.eu.example.com":    {"k": "longer"},
		"*.x.eu.example.com.": {"k": "longest"},
		"API2.Example.COM":    {"k": "exact-upper"},
	}
	for host, want := range map[string]string{
		"api.example.com":      "exact",
		"api2.example.com":     "exact-upper",
		"b.example.com":        "wild",
		"a.eu.example.com":     "longer",
		"eu.example.com":       "wild",
		"z.x.eu.example.com":   "longest",
		"example.com":          "",
		"evilexample.com":      "",
		"api.example.com.evil": "",
	} {
		got := ruleFor(rules, host)["k"]
		if got != want {
			t.Errorf("ruleFor(%q) = %q, want %q", host, got, want)
		}
	}
}

func TestManyConcurrentStreams(t *testing.T) {
	h := newHarness(t, ruleConfig(t))
	h.secrets.set("TOKEN", tokenValue)
	c := h.client("h2")
	get(t, c, "https://api.test/warm")
	// 60 streams at a time (under MaxStreams), 240 requests in all.
	errs := make(chan error, 60)
	for i := 0; i < 60; i++ {
		go func() {
			for j := 0; j < 4; j++ {
				resp, err := c.Get("https://api.test/echo")
				if err != nil {
					errs <- err
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || strings.Contains(string(b), tokenValue) {
					errs <- io.ErrUnexpectedEOF
					return
				}
			}
			errs <- nil
		}()
	}
	for i := 0; i < 60; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if h.served.Load() != 1 {
		t.Errorf("%d sandbox connections, want 1 (HTTP/2 multiplexed)", h.served.Load())
	}
	seen := h.seenHost("api.test")
	if len(seen) != 241 {
		t.Errorf("upstream saw %d requests, want 241", len(seen))
	}
	for _, s := range seen {
		if s.Header.Get("Authorization") != "Bearer "+tokenValue {
			t.Fatalf("a stream went out without its header: %+v", s.Header)
		}
	}
}

func TestEventCountsBodies(t *testing.T) {
	h := newHarness(t, &Config{Policy: allowAll(t), Inspect: true})
	c := h.client("h1")
	resp, err := c.Post("https://api.test/echo?secret-query=1", "text/plain", strings.NewReader(strings.Repeat("b", 1000)))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	ev := h.rec.waitEvent(t, func(ev Event) bool { return ev.Method == "POST" })
	if ev.BytesOut != 1000 || ev.BytesIn != n || ev.Path != "/echo" || ev.Host != "api.test" || ev.Status != 200 || !ev.Allowed || ev.SandboxID != "sbx-test" {
		t.Fatalf("event %+v (response %d bytes)", ev, n)
	}
}
