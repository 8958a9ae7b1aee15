package httpapi

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestBodyIdleTimeout: a client that stops sending its request body loses
// the connection; one that keeps sending, however long the body takes, is
// served; and a response stream outlives the body's deadline (the
// server's hang-up watch reads the same connection). The short timeout
// makes the test quick; nothing asserts how fast anything happens.
func TestBodyIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	e := newTestEnv(t)
	srv := httptest.NewServer(New(Options{Manager: e.m, Pauses: e.m.Pauses(), Network: e.net, APIKey: testKey, Domain: "fence.test", BodyIdleTimeout: idle}))
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()

	dial := func(t *testing.T) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		// A hang guard, not a timing assertion.
		c.SetDeadline(time.Now().Add(30 * time.Second))
		return c
	}

	t.Run("stalled body", func(t *testing.T) {
		c := dial(t)
		fmt.Fprintf(c, "POST /sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"temp", testKey)
		// The server answers (the body read failed) and closes.
		rest, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("reading after a stalled body: %v (got %q); want the server to close the connection", err, rest)
		}
		t.Logf("server's answer to a stalled body: %q", firstLine(rest))
		if n, _ := e.m.Counts(); n != 0 {
			t.Errorf("a sandbox was created from a stalled body")
		}
	})

	t.Run("slow body that keeps moving", func(t *testing.T) {
		c := dial(t)
		body := `{"templateID":"base"` + strings.Repeat(" ", 40) + "}" // the decoder needs every byte
		fmt.Fprintf(c, "POST /sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", testKey, len(body))
		start := time.Now()
		for i := 0; i < len(body); i += 4 { // 4 bytes every idle/4: 4 idle periods at least
			time.Sleep(idle / 4)
			if _, err := io.WriteString(c, body[i:min(i+4, len(body))]); err != nil {
				t.Fatalf("writing the body: %v", err)
			}
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		t.Logf("body sent over %v with a %v idle bound: %d", time.Since(start).Round(time.Millisecond), idle, resp.StatusCode)
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("POST /sandboxes with a slow body = %d, want 201", resp.StatusCode)
		}
	})

	t.Run("stream outlives the body deadline", func(t *testing.T) {
		s := e.create(t, `{"templateID":"base"}`)
		req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/process.Process/Start",
			strings.NewReader("\x00\x00\x00\x00\x02{}"))
		for _, h := range sbxHeaders(s.SandboxID, s.EnvdAccessToken) {
			k, v, _ := strings.Cut(h, ": ")
			req.Header.Set(k, v)
		}
		req.Header.Set("Content-Type", "application/connect+json")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		until := time.Now().Add(4 * idle)
		n := 0
		for time.Now().Before(until) {
			if _, err := readEnvelope(br); err != nil {
				t.Fatalf("stream broke after %d envelopes: %v", n, err)
			}
			n++
		}
		t.Logf("stream ran %d envelopes over %v", n, 4*idle)
	})
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\r\n")
	return s
}
