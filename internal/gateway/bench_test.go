package gateway

import (
	"io"
	"net/http"
	"strconv"
	"testing"
)

// The benchmarks compare a request through the gateway (TLS terminated,
// decided, re-encrypted upstream) with the same request relayed untouched
// (the stack's pass-through), both over loopback with real TLS.

func benchHandler(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/small":
		io.WriteString(w, `{"ok":true,"id":"0123456789abcdef"}`)
	case "/bulk":
		mb, _ := strconv.Atoi(r.URL.Query().Get("mb"))
		chunk := make([]byte, 1<<20)
		w.Header().Set("Content-Length", strconv.Itoa(mb<<20))
		for i := 0; i < mb; i++ {
			w.Write(chunk)
		}
	}
}

func benchRun(b *testing.B, cfg *Config, intercepted bool) {
	for _, proto := range []string{"h1", "h2"} {
		b.Run("small-"+proto, func(b *testing.B) {
			h := newHarness(b, cfg)
			h.secrets.set("TOKEN", tokenValue)
			h.handler = http.HandlerFunc(benchHandler)
			h.upTLS.Config.Handler = http.HandlerFunc(benchHandler)
			c := h.client(proto)
			if !intercepted {
				c = h.clientTrusting(proto, h.upRoots)
			}
			get(b, c, "https://api.test/small") // connect, handshakes
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				resp, err := c.Get("https://api.test/small")
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			b.StopTimer()
			if intercepted != (h.served.Load() > 0) {
				b.Fatalf("intercepted %d connections, passed %d", h.served.Load(), h.passthrough.Load())
			}
		})
		b.Run("bulk-"+proto, func(b *testing.B) {
			h := newHarness(b, cfg)
			h.secrets.set("TOKEN", tokenValue)
			h.upTLS.Config.Handler = http.HandlerFunc(benchHandler)
			c := h.client(proto)
			if !intercepted {
				c = h.clientTrusting(proto, h.upRoots)
			}
			const mb = 32
			b.SetBytes(mb << 20)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				resp, err := c.Get("https://api.test/bulk?mb=" + strconv.Itoa(mb))
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if n != mb<<20 {
					b.Fatalf("got %d bytes", n)
				}
			}
		})
	}
}

func BenchmarkPassthrough(b *testing.B) {
	benchRun(b, &Config{Policy: allowAll(b)}, false)
}

func BenchmarkIntercepted(b *testing.B) {
	b.Run("inspect", func(b *testing.B) { benchRun(b, &Config{Policy: allowAll(b), Inspect: true}, true) })
	// With a header rule: a secret is put in and the response is masked.
	b.Run("rule", func(b *testing.B) { benchRun(b, ruleConfig(b), true) })
}
