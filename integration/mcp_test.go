package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/mcp"
)

// mcpCall calls a tool and decodes its structured result into out (when
// out is not nil). It returns the result, whose IsError the caller checks.
func mcpCall(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any, out any) *sdk.CallToolResult {
	t.Helper()
	return mcpCallParams(t, cs, &sdk.CallToolParams{Name: name, Arguments: args}, out)
}

func mcpCallParams(t *testing.T, cs *sdk.ClientSession, p *sdk.CallToolParams, out any) *sdk.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(ctxT(t), p)
	if err != nil {
		t.Fatalf("%s: protocol error: %v", p.Name, err)
	}
	if out != nil && !res.IsError {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: decoding %s: %v", p.Name, b, err)
		}
	}
	return res
}

// mcpMust calls a tool that must succeed.
func mcpMust(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any, out any) {
	t.Helper()
	if res := mcpCall(t, cs, name, args, out); res.IsError {
		t.Fatalf("%s(%v): tool error: %s", name, args, resultText(res))
	}
}

func resultText(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// progressLog collects the progress notifications a client receives.
type progressLog struct {
	mu   sync.Mutex
	msgs []string
}

func (p *progressLog) handler(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, req.Params.Message)
}

func (p *progressLog) text() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.msgs, "")
}

// await waits until the notifications carried want, in order.
func (p *progressLog) await(t *testing.T, want string) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("progress notifications carrying %q", want), func() bool {
		got := p.text()
		if !strings.HasPrefix(want, got) {
			t.Fatalf("progress notifications carried %q, want %q", got, want)
		}
		return got == want
	})
}

// TestMCP drives the MCP tools with the go-sdk's client: over an in-memory
// transport to a server using the daemon's API, and over streamable HTTP
// to the daemon's /mcp.
func TestMCP(t *testing.T) {
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	progress := &progressLog{}
	cl := sdk.NewClient(&sdk.Implementation{Name: "fence-test", Version: "1"},
		&sdk.ClientOptions{ProgressNotificationHandler: progress.handler})
	st, ct := sdk.NewInMemoryTransports()
	ss, err := mcp.NewServer(d.Client).Connect(ctxT(t), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := cl.Connect(ctxT(t), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	tools, err := cs.ListTools(ctxT(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.InputSchema == nil {
			t.Errorf("tool %s has no description or input schema", tool.Name)
		}
	}
	for _, want := range []string{"create_sandbox", "run_command", "read_file", "write_file", "list_files",
		"checkpoint", "list_checkpoints", "diff", "rewind", "kill_sandbox", "list_sandboxes"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools/list lacks %s: %v", want, names)
		}
	}

	t.Run("bad arguments", func(t *testing.T) { mcpBadArguments(t, cs) })

	var sb mcp.SandboxOutput
	mcpMust(t, cs, "create_sandbox", map[string]any{"template": "base", "timeout_seconds": 300,
		"allow_out": []string{"example.com"}, "metadata": map[string]string{"owner": "mcp-test"}}, &sb)
	id := sb.SandboxID
	defer d.Client.Kill(context.Background(), id)

	var run mcp.RunOutput
	res := mcpCallParams(t, cs, &sdk.CallToolParams{Name: "run_command", Meta: sdk.Meta{"progressToken": "p1"},
		Arguments: map[string]any{"sandbox_id": id, "command": "python3 -c 'print(6*7)'"}}, &run)
	if res.IsError || run.ExitCode != 0 || run.Stdout != "42\n" {
		t.Fatalf("run_command: error %v (%s), got %+v, want 42 and exit 0", res.IsError, resultText(res), run)
	}
	// The client hands notifications to their handler apart from the
	// result, which may come first.
	progress.await(t, "42\n")
	mcpMust(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "echo oops >&2; exit 3"}, &run)
	if run.ExitCode != 3 || run.Stderr != "oops\n" {
		t.Errorf("failing command: got %+v, want exit 3 and oops on stderr", run)
	}
	mcpMust(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "sleep 30", "timeout_seconds": 1}, &run)
	if !run.TimedOut {
		t.Errorf("sleep 30 with a 1 s timeout: got %+v, want timed_out", run)
	}

	t.Run("files and checkpoints", func(t *testing.T) { mcpFilesAndCheckpoints(t, cs, id) })

	var list mcp.ListOutput
	mcpMust(t, cs, "list_sandboxes", map[string]any{"metadata": map[string]string{"owner": "mcp-test"}}, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].SandboxID != id {
		t.Errorf("list_sandboxes by metadata: got %+v, want only %s", list.Sandboxes, id)
	}

	t.Run("http", func(t *testing.T) { mcpOverHTTP(t, d, id) })

	mcpMust(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id}, nil)
	if res := mcpCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "true"}, nil); !res.IsError {
		t.Errorf("run_command on a killed sandbox succeeded")
	}
}

// mcpBadArguments checks that bad arguments are tool errors.
func mcpBadArguments(t *testing.T, cs *sdk.ClientSession) {
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"run_command", map[string]any{"command": "true"}},                       // no sandbox_id
		{"run_command", map[string]any{"sandbox_id": "nope", "command": 7}},      // wrong type
		{"run_command", map[string]any{"sandbox_id": "nope", "command": ""}},     // empty command
		{"run_command", map[string]any{"sandbox_id": "nope", "command": "true"}}, // no such sandbox
		{"run_command", map[string]any{"sandbox_id": "x", "command": "true", "timeout_seconds": -1}},
		{"create_sandbox", map[string]any{"template": "no-such-template"}},
		{"create_sandbox", map[string]any{"timeout_seconds": "soon"}},
		{"create_sandbox", map[string]any{"secrets": map[string]any{"TOKEN": map[string]any{"secret": "s", "hosts": []string{}}}}},
		{"write_file", map[string]any{"sandbox_id": "x", "path": "/tmp/f", "content": "!", "encoding": "base64"}},
		{"read_file", map[string]any{"sandbox_id": "x", "path": "/etc/hostname", "max_bytes": 1 << 30}},
		{"rewind", map[string]any{"sandbox_id": "x"}},
		{"list_sandboxes", map[string]any{"state": []string{"dead"}}},
		{"kill_sandbox", map[string]any{"sandbox_id": "no-such-sandbox"}},
	} {
		res := mcpCall(t, cs, c.tool, c.args, nil)
		if !res.IsError || resultText(res) == "" {
			t.Errorf("%s(%v): got %+v, want a tool error with a message", c.tool, c.args, res)
		}
	}
	var list mcp.ListOutput
	mcpMust(t, cs, "list_sandboxes", nil, &list)
	if len(list.Sandboxes) != 0 {
		t.Errorf("bad arguments left sandboxes behind: %+v", list.Sandboxes)
	}
}

// mcpFilesAndCheckpoints writes, reads and lists files, then checkpoints,
// diffs and rewinds the sandbox id.
func mcpFilesAndCheckpoints(t *testing.T, cs *sdk.ClientSession, id string) {
	var wr mcp.WriteOutput
	mcpMust(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/home/user/notes.txt", "content": "kept\n"}, &wr)
	var rd mcp.ReadOutput
	mcpMust(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/home/user/notes.txt"}, &rd)
	if rd.Content != "kept\n" || rd.Encoding != "utf8" {
		t.Errorf("read_file: got %+v, want the content written", rd)
	}
	mcpMust(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/home/user/bin.dat", "content": "AP8=", "encoding": "base64"}, nil)
	mcpMust(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/home/user/bin.dat"}, &rd)
	if rd.Content != "AP8=" || rd.Encoding != "base64" {
		t.Errorf("read_file of binary: got %+v, want AP8= in base64", rd)
	}
	var ls mcp.ListFilesOutput
	mcpMust(t, cs, "list_files", map[string]any{"sandbox_id": id, "path": "/home/user"}, &ls)
	if !slices.ContainsFunc(ls.Entries, func(e mcp.Entry) bool { return e.Path == "/home/user/notes.txt" && e.Type == "file" }) {
		t.Errorf("list_files: no notes.txt in %+v", ls.Entries)
	}

	mcpMust(t, cs, "checkpoint", map[string]any{"sandbox_id": id, "name": "before"}, nil)
	mcpMust(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/home/user/notes.txt", "content": "clobbered\n"}, nil)
	var diff mcp.DiffOutput
	mcpMust(t, cs, "diff", map[string]any{"sandbox_id": id, "from": "before"}, &diff)
	if !slices.ContainsFunc(diff.Changes, func(c api.FileDiff) bool { return c.Path == "/home/user/notes.txt" && c.Change == "changed" }) {
		t.Errorf("diff from before: got %+v, want notes.txt changed", diff.Changes)
	}
	mcpMust(t, cs, "rewind", map[string]any{"sandbox_id": id, "checkpoint": "before"}, nil)
	mcpMust(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/home/user/notes.txt"}, &rd)
	if rd.Content != "kept\n" {
		t.Errorf("after rewind: notes.txt is %q, want kept", rd.Content)
	}
	var cps mcp.CheckpointsOutput
	mcpMust(t, cs, "list_checkpoints", map[string]any{"sandbox_id": id}, &cps)
	if len(cps.Checkpoints) == 0 || cps.Checkpoints[0].Name != "before" {
		t.Errorf("list_checkpoints: got %+v, want before", cps.Checkpoints)
	}
}

// keyTransport adds the API key to every request.
type keyTransport struct {
	key  string
	base http.RoundTripper
}

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if k.key != "" {
		r.Header.Set("X-API-Key", k.key)
	}
	return k.base.RoundTrip(r)
}

// mcpOverHTTP uses the daemon's /mcp: refused without the key, and with
// it a command's output streams back as progress.
func mcpOverHTTP(t *testing.T, d *daemon, id string) {
	connect := func(key string, progress *progressLog) (*sdk.ClientSession, error) {
		cl := sdk.NewClient(&sdk.Implementation{Name: "fence-test-http", Version: "1"},
			&sdk.ClientOptions{ProgressNotificationHandler: progress.handler})
		return cl.Connect(ctxT(t), &sdk.StreamableClientTransport{Endpoint: d.URL + "/mcp",
			HTTPClient: &http.Client{Transport: keyTransport{key: key, base: http.DefaultTransport}}, MaxRetries: -1}, nil)
	}
	if cs, err := connect("", &progressLog{}); err == nil {
		cs.Close()
		t.Fatalf("/mcp without an API key: connected, want refused")
	}
	progress := &progressLog{}
	cs, err := connect(d.Key, progress)
	if err != nil {
		t.Fatalf("/mcp: %v", err)
	}
	defer cs.Close()
	var run mcp.RunOutput
	res := mcpCallParams(t, cs, &sdk.CallToolParams{Name: "run_command", Meta: sdk.Meta{"progressToken": 7},
		Arguments: map[string]any{"sandbox_id": id, "command": "echo one; sleep 0.2; echo two"}}, &run)
	if res.IsError || run.ExitCode != 0 || run.Stdout != "one\ntwo\n" {
		t.Fatalf("run_command over HTTP: error %v (%s), got %+v", res.IsError, resultText(res), run)
	}
	progress.await(t, "one\ntwo\n")
}
