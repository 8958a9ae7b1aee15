package mcp

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fencesandbox/fence/client"
)

// connectTest returns a client session of s over an in-memory transport.
func connectTest(t *testing.T, s *sdk.Server) *sdk.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	st, ct := sdk.NewInMemoryTransports()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestBadInputMakesNoRequest checks that arguments the tools refuse are
// tool errors and reach no daemon.
func TestBadInputMakesNoRequest(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.Error(w, "unexpected", http.StatusTeapot)
	}))
	defer srv.Close()
	cs := connectTest(t, NewServer(client.New(srv.URL, "key")))
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"run_command", map[string]any{"sandbox_id": "", "command": "true"}},
		{"run_command", map[string]any{"sandbox_id": "a", "command": ""}},
		{"run_command", map[string]any{"sandbox_id": "a", "command": "true", "timeout_seconds": 1e9}},
		{"run_command", map[string]any{"sandbox_id": "a"}},
		{"read_file", map[string]any{"sandbox_id": "a", "path": ""}},
		{"read_file", map[string]any{"sandbox_id": "a", "path": "/f", "max_bytes": -1}},
		{"write_file", map[string]any{"sandbox_id": "a", "path": "/f", "content": "x", "encoding": "utf16"}},
		{"list_files", map[string]any{"sandbox_id": "a", "path": "/", "depth": 11}},
		{"create_sandbox", map[string]any{"timeout_seconds": -5}},
		{"create_sandbox", map[string]any{"secrets": map[string]any{"T": map[string]any{"secret": "", "hosts": []string{"h"}}}}},
		{"rewind", map[string]any{"sandbox_id": "a", "checkpoint": ""}},
		{"diff", map[string]any{"sandbox_id": " "}},
		{"list_sandboxes", map[string]any{"state": []string{"gone"}}},
		{"no_such_tool", nil},
	} {
		res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: c.tool, Arguments: c.args})
		if c.tool == "no_such_tool" {
			if err == nil && !res.IsError {
				t.Errorf("an unknown tool succeeded")
			}
			continue
		}
		if err != nil {
			t.Errorf("%s(%v): protocol error %v, want a tool error", c.tool, c.args, err)
			continue
		}
		if !res.IsError {
			t.Errorf("%s(%v): succeeded, want a tool error", c.tool, c.args)
		}
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("refused arguments made %d requests to the daemon", n)
	}
}

// TestPanicIsToolError checks that a tool that panics answers a tool
// error and leaves the session serving.
func TestPanicIsToolError(t *testing.T) {
	s := sdk.NewServer(&sdk.Implementation{Name: "test", Version: "1"}, nil)
	addTool(s, "boom", "panics", func(context.Context, *sdk.CallToolRequest, struct{}) (struct{}, error) {
		panic("kaboom")
	})
	cs := connectTest(t, s)
	for range 2 {
		res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "boom"})
		if err != nil {
			t.Fatalf("protocol error %v, want a tool error", err)
		}
		if !res.IsError || !strings.Contains(res.Content[0].(*sdk.TextContent).Text, "kaboom") {
			t.Fatalf("got %+v, want a tool error naming the panic", res)
		}
	}
}

// TestTailKeepsTheEnd checks run_command's output bound.
func TestTailKeepsTheEnd(t *testing.T) {
	var tl tail
	tl.write([]byte(strings.Repeat("a", OutputCap)))
	if tl.cut {
		t.Fatalf("cut at exactly OutputCap")
	}
	tl.write([]byte("end"))
	if !tl.cut || len(tl.b) != OutputCap || !strings.HasSuffix(string(tl.b), "aend") {
		t.Fatalf("after OutputCap+3 bytes: cut %v, %d bytes kept, ending %q", tl.cut, len(tl.b), tl.b[len(tl.b)-4:])
	}
}

// TestLoopbackStreams checks that a response served through Loopback
// reaches the client as it is flushed, before the handler returns.
func TestLoopbackStreams(t *testing.T) {
	release := make(chan struct{})
	hc, stop := Loopback(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("first\n"))
		http.NewResponseController(w).Flush()
		<-release
		w.Write([]byte("second\n"))
	}))
	defer stop()
	resp, err := hc.Get("http://anything/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first line: %q, %v", line, err)
	}
	close(release)
	if line, err = br.ReadString('\n'); err != nil || line != "second\n" {
		t.Fatalf("second line: %q, %v", line, err)
	}
	stop()
	if _, err := hc.Get("http://anything/"); err == nil {
		t.Errorf("a request after stop succeeded")
	}
}

// switchKey sends the API key it currently holds with every request.
type switchKey struct{ key atomic.Value }

func (s *switchKey) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-API-Key", s.key.Load().(string))
	return http.DefaultTransport.RoundTrip(r)
}

// TestHTTPSessionKeepsItsKey checks that an HTTP session's requests must
// carry the API key that opened it.
func TestHTTPSessionKeepsItsKey(t *testing.T) {
	srv := httptest.NewServer(NewHTTPHandler(func(key string) *client.Client {
		return client.New("http://127.0.0.1:1", key)
	}))
	defer srv.Close()
	tr := &switchKey{}
	tr.key.Store("key-a")
	cl := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := cl.Connect(context.Background(), &sdk.StreamableClientTransport{Endpoint: srv.URL,
		HTTPClient: &http.Client{Transport: tr}, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatalf("with the session's key: %v", err)
	}
	tr.key.Store("key-b")
	if _, err := cs.ListTools(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "another API key") {
		t.Errorf("with another key: %v, want refused", err)
	}
	tr.key.Store("key-a")
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Errorf("with the session's key again: %v", err)
	}
}
