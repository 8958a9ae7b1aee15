package egress_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

// TestEveryRequestChecked sends streams to allowed.test's address (port 9,
// an upstream that records every byte) and checks what reached it and the
// flow's event.
func TestEveryRequestChecked(t *testing.T) {
	const ok = "GET /a HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
	chunked := "POST /c HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
	cl := "PUT /l HTTP/1.1\r\nHost: Allowed.Test.:9\r\nContent-Length: 5\r\n\r\nhello"
	for _, tc := range []struct {
		name, send string
		wantUp     string // what the upstream must have received
		allowed    bool
		reason     string
		observed   string
	}{
		{"keep-alive", ok + chunked + "\r\n" + cl, ok + chunked + cl, true, policy.ReasonAllowName, "allowed.test"},
		{"pipelined evil", ok + "GET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n", ok, false, policy.ReasonNameNotAllowed, "evil.test"},
		{"pipelined other allowed name not resolved", ok + "GET /b HTTP/1.1\r\nHost: shared.test\r\n\r\n", ok, false, policy.ReasonNameMismatch, "shared.test"},
		{"blank line then evil", "\r\nGET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n", "", false, policy.ReasonNameNotAllowed, "evil.test"},
		{"PROPFIND evil", "PROPFIND / HTTP/1.1\r\nHost: evil.test\r\n\r\n", "", false, policy.ReasonNameNotAllowed, "evil.test"},
		{"absolute-form after allowed", ok + "GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", ok, false, egress.ReasonSniff, "allowed.test"},
		{"IP literal Host", "GET / HTTP/1.1\r\nHost: 203.0.113.10\r\n\r\n", "", false, policy.ReasonNameNotAllowed, "203.0.113.10"},
		{"h2 prior knowledge", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "", false, egress.ReasonHTTP2, ""},
		{"h2c upgrade", "GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n", "", false, egress.ReasonHTTP2, ""},
		{"CONNECT", "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", "", false, egress.ReasonConnect, ""},
		{"smuggling CL.TE", "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", "", false, egress.ReasonSniff, ""},
		{"not HTTP", "\x00\x01binary\r\n", "", false, egress.ReasonNotHTTP, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, allowList, nil)
			e.lookup(t, "allowed.test")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := e.sb.DialTCP(ctx, ap("203.0.113.10:9"))
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, tc.send)
			if tc.allowed {
				c.(interface{ CloseWrite() error }).CloseWrite()
			}
			io.Copy(io.Discard, c) // until the stack ends the flow
			c.Close()
			evs := e.waitEvents(t, "tcp", 1)
			if len(evs) != 1 {
				t.Fatalf("events = %+v, want 1", evs)
			}
			ev := evs[0]
			if ev.Allowed != tc.allowed || ev.Reason != tc.reason || ev.Observed != tc.observed || ev.SandboxID != "sbx1" {
				t.Errorf("event = allowed %v reason %q observed %q sandbox %q; want %v %q %q sbx1",
					ev.Allowed, ev.Reason, ev.Observed, ev.SandboxID, tc.allowed, tc.reason, tc.observed)
			}
			var got []string
			deadline := time.Now().Add(5 * time.Second)
			for len(got) == 0 && time.Now().Before(deadline) {
				got = e.ups[9].received()
				time.Sleep(5 * time.Millisecond)
			}
			if !slices.Equal(got, []string{tc.wantUp}) {
				t.Errorf("upstream received %q, want %q", got, tc.wantUp)
			}
			if strings.Contains(strings.Join(got, ""), "evil") {
				t.Errorf("evil.test reached the upstream")
			}
		})
	}
}

// sendAll writes send on a flow to dst, half-closes, reads until the
// stack or the upstream ends the flow, and returns the flow's event.
func sendAll(t *testing.T, e *env, dst string, send string) (string, egress.FlowEvent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.sb.DialTCP(ctx, ap(dst))
	if err != nil {
		t.Fatalf("dial %s: %v", dst, err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, send)
	c.(interface{ CloseWrite() error }).CloseWrite()
	b, _ := io.ReadAll(c)
	c.Close()
	evs := e.waitEvents(t, "tcp", 1)
	if len(evs) != 1 {
		t.Fatalf("events = %+v, want 1", evs)
	}
	return string(b), evs[0]
}

// TestDenyNameEveryRequest: on a flow allowed by default, deny name rules
// apply to every request; a stream that is not HTTP passes as before.
func TestDenyNameEveryRequest(t *testing.T) {
	spec := policy.Spec{AllowAll: true, Deny: []policy.Rule{{Name: "evil.test"}}}
	const ok = "GET /a HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
	e := newEnv(t, spec, nil)
	_, ev := sendAll(t, e, "203.0.113.10:9", ok+"GET /b HTTP/1.1\r\nHost: Evil.Test.\r\n\r\n")
	if ev.Allowed || ev.Reason != policy.ReasonDenyName || ev.Observed != "Evil.Test." {
		t.Errorf("pipelined denied name: event %+v, want a deny-name refusal", ev)
	}
	// The upstream logs what it read on its own goroutine: wait for it.
	var got []string
	for deadline := time.Now().Add(5 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		got = e.ups[9].received()
	}
	if !slices.Equal(got, []string{ok}) {
		t.Errorf("upstream received %q, want only the first request", got)
	}
	e = newEnv(t, spec, nil)
	_, ev = sendAll(t, e, "203.0.113.10:9", "PING evil.test\r\n")
	if !ev.Allowed {
		t.Errorf("a line protocol on a default-allowed flow: event %+v, want allowed", ev)
	}
}

// TestWebSocketUpgrade: after a checked upgrade request that the server
// answers with 101, the stream is opaque (see the package doc).
func TestWebSocketUpgrade(t *testing.T) {
	e := newEnv(t, allowList, nil)
	e.ups[81] = newUpstream(t, func(c net.Conn, r *bufio.Reader) {
		if _, err := http.ReadRequest(r); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		io.Copy(c, r) // echo the frames
	})
	e.lookup(t, "allowed.test")
	up := "GET /ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
	frames := "\x81\x05hello GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	out, ev := sendAll(t, e, "203.0.113.10:81", up+frames)
	if !ev.Allowed || !strings.HasSuffix(out, "\r\n\r\n"+frames) {
		t.Errorf("after a 101: got %q, event %+v; want the frames echoed, allowed", out, ev)
	}
}

// BenchmarkUploadHTTPChecked is BenchmarkUpload for a body on a
// name-admitted plain-HTTP flow, which goes through the request checker.
func BenchmarkUploadHTTPChecked(b *testing.B) {
	e := newEnv(b, allowList, nil)
	e.lookup(b, "allowed.test")
	c, err := e.sb.DialTCP(context.Background(), ap("203.0.113.10:9"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "POST /upload HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 999999999999999\r\n\r\n"); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}
