package mcpgateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// serverEnvVar makes the test binary an MCP server over stdio whose one
// tool is named by the variable's value.
const serverEnvVar = "MCPGATEWAY_TEST_SERVER"

// stateEnv gives the test binary, run as the serving process, the
// test's state directory.
const stateEnv = "MCPGATEWAY_TEST_STATE"

func TestMain(m *testing.M) {
	if dir := os.Getenv(stateEnv); dir != "" {
		stateDir, logFile, listenAddr = dir, filepath.Join(dir, "log"), "127.0.0.1:0"
		if len(os.Args) == 2 && os.Args[1] == "serve" {
			os.Exit(Main(os.Args[1:], os.Stderr))
		}
	}
	if tool := os.Getenv(serverEnvVar); tool != "" {
		s := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "1"}, nil)
		type in struct {
			Word string `json:"word"`
		}
		mcp.AddTool(s, &mcp.Tool{Name: tool}, func(ctx context.Context, _ *mcp.CallToolRequest, a in) (*mcp.CallToolResult, any, error) {
			text := tool + ":" + a.Word + ":" + os.Getenv("PLAIN") + ":" + os.Getenv(tokenEnv)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
		})
		if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func testServer(t *testing.T, name, tool string) Server {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Server{Name: name, RunCmd: serverEnvVar + "=" + tool + " exec " + shellQuote(exe), Envs: map[string]string{"PLAIN": "p-" + name}}
}

func TestGatewayAggregatesAndChecksTheToken(t *testing.T) {
	t.Setenv(tokenEnv, "tok")
	ctx := context.Background()
	g, err := Open(ctx, []Server{testServer(t, "a", "echo_a"), testServer(t, "b", "echo_b")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	hs := httptest.NewServer(g.Handler("tok"))
	t.Cleanup(hs.Close)

	for _, hdr := range []string{"", "Bearer nope", "tok", "Bearer tok2"} {
		req, _ := http.NewRequest("POST", hs.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		if hdr != "" {
			req.Header.Set("Authorization", hdr)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("Authorization %q: status %d, want 401", hdr, res.StatusCode)
		}
	}

	client := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL + "/mcp", HTTPClient: &http.Client{Transport: bearer{"tok"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tool.Name)
	}
	if strings.Join(names, ",") != "echo_a,echo_b" {
		t.Fatalf("tools = %v, want echo_a,echo_b (the servers' own names)", names)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo_b", Arguments: map[string]any{"word": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	// The server got its envs and not the gateway's token.
	if got := res.Content[0].(*mcp.TextContent).Text; got != "echo_b:hi:p-b:" {
		t.Fatalf("echo_b answered %q, want %q", got, "echo_b:hi:p-b:")
	}
}

type bearer struct{ tok string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return http.DefaultTransport.RoundTrip(r)
}

func TestGatewayRefusesAToolNameTwice(t *testing.T) {
	_, err := Open(context.Background(), []Server{testServer(t, "a", "same"), testServer(t, "b", "same")})
	if err == nil || !strings.Contains(err.Error(), `servers "a" and "b" both offer a tool "same"`) {
		t.Fatalf("Open = %v, want the clash named", err)
	}
}

func TestGatewayServerThatFailsToStart(t *testing.T) {
	_, err := Open(context.Background(), []Server{{Name: "x", RunCmd: "exit 3"}})
	if err == nil || !strings.Contains(err.Error(), `server "x"`) {
		t.Fatalf("Open = %v, want an error naming the server", err)
	}
}

func TestParseConfig(t *testing.T) {
	got, err := ParseConfig([]byte(`{"z":{"runCmd":"z-server","installCmd":"true","envs":{"A":"1"},"secrets":{"TOKEN":{"secret":"s","hosts":["api.example.com"]}}},"github/o/r":{"npm":"@scope/pkg@1.2.3","args":["--x"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "github/o/r" || got[0].NPM != "@scope/pkg@1.2.3" || got[1].RunCmd != "z-server" || got[1].Secrets[0] != "TOKEN" {
		t.Fatalf("ParseConfig = %+v", got)
	}
	if npmName("@scope/pkg@1.2.3") != "@scope/pkg" || npmName("pkg") != "pkg" {
		t.Fatal("npmName")
	}
	for _, bad := range []string{
		`[]`, `{}`, `{"a":{}}`, `{"a":{"runCmd":"x","unknown":1}}`, `{"a":"airtable"}`,
		`{"a":{"runCmd":"x","npm":"p"}}`, `{"a":{"npm":"Bad Name"}}`, `{"a":{"runCmd":"x","args":["y"]}}`,
		`{"a":{"runCmd":"x","envs":{"GATEWAY_ACCESS_TOKEN":"t"}}}`, `{"a":{"runCmd":"x","envs":{"1A":"t"}}}`,
		`{"a":{"runCmd":"x","envs":{"T":"1"},"secrets":{"T":{}}}}`,
	} {
		if _, err := ParseConfig([]byte(bad)); err == nil {
			t.Errorf("ParseConfig(%s) = nil error", bad)
		}
	}
}

// Start returns once the serving process serves, although the servers it
// started live on (and must not hold the pipe it reports on); it stores
// the token for getMcpToken().
func TestStartReturnsWhileServersRun(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(stateEnv, dir)
	stateDir, logFile, listenAddr = dir, filepath.Join(dir, "log"), "127.0.0.1:0"
	t.Cleanup(func() { stateDir, logFile, listenAddr = "/etc/mcp-gateway", "/var/log/mcp-gateway.log", ":50005" })
	s := testServer(t, "a", "echo_a")
	config := `{"a":{"runCmd":` + strconv.Quote(s.RunCmd) + `}}`
	done := make(chan error, 1)
	go func() { done <- Start(context.Background(), []byte(config), "tok", os.Stderr) }()
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(dir, "gateway.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Start did not return while its server runs")
	}
	if b, err := os.ReadFile(filepath.Join(dir, ".token")); err != nil || string(b) != "tok" {
		t.Errorf(".token = %q, %v", b, err)
	}
	if err := Start(context.Background(), []byte(config), "", os.Stderr); err == nil {
		t.Error("Start without a token = nil error")
	}
	unbound := `{"a":{"runCmd":"true","secrets":{"MCPGATEWAY_TEST_UNBOUND":{"secret":"s","hosts":["h.example"]}}}}`
	if err := Start(context.Background(), []byte(unbound), "tok2", os.Stderr); err == nil || !strings.Contains(err.Error(), "MCPGATEWAY_TEST_UNBOUND is not bound") {
		t.Errorf("Start with a secret variable the sandbox lacks = %v, want an error naming it", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ".token")); string(b) != "tok" {
		t.Errorf("a refused start changed the token to %q", b)
	}
}
