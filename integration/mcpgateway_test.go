package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// mcpFetchServer is a minimal MCP server over stdio (the e2b SDK tests run
// one made with the MCP SDK): its one tool, fetch, GETs a URL with the
// header X-Api-Key from $UPSTREAM_TOKEN and returns the body.
const mcpFetchServer = `import json, os, sys, urllib.request
for line in sys.stdin:
    m = json.loads(line)
    if 'id' not in m:
        continue
    if m['method'] == 'initialize':
        r = {'protocolVersion': m['params']['protocolVersion'], 'capabilities': {'tools': {}}, 'serverInfo': {'name': 'fetch', 'version': '1'}}
    elif m['method'] == 'tools/list':
        r = {'tools': [{'name': 'fetch', 'inputSchema': {'type': 'object', 'properties': {'url': {'type': 'string'}}}}]}
    elif m['method'] == 'tools/call':
        req = urllib.request.Request(m['params']['arguments']['url'], headers={'X-Api-Key': os.environ.get('UPSTREAM_TOKEN', '')})
        try:
            text = urllib.request.urlopen(req, timeout=20).read().decode()
        except Exception as e:
            text = 'error: %s' % e
        r = {'content': [{'type': 'text', 'text': text}]}
    else:
        r = {}
    sys.stdout.write(json.dumps({'jsonrpc': '2.0', 'id': m['id'], 'result': r}) + '\n')
    sys.stdout.flush()
`

// TestMCPGatewaySecret: an MCP server of E2B's mcp option whose variable
// is bound to a fence secret sees a placeholder, and the egress gateway
// puts the real value on the wire to the bound host only; the sandbox's
// files, environment and process memory never hold it. The gateway is
// started as the SDKs start it (mcp-gateway --config, GATEWAY_ACCESS_TOKEN)
// and reached through the daemon on port 50005.
func TestMCPGatewaySecret(t *testing.T) {
	requireTemplate(t, "mcp-gateway")
	fn := newFakeNet(t)
	d := startDaemon(t, newDataDir(t), "--dns-upstream", fn.DNS.Addr, "--upstream-ca", fn.CAFile)
	const value = "mcp-s3cr3t-VALUE-0123456789"
	if r := d.do(t, "POST", "/secrets", d.Key, strings.NewReader(fmt.Sprintf(`{"name":"mcp-upstream","value":%q}`, value)), nil); r.Status != 201 {
		t.Fatalf("POST /secrets = %d %s", r.Status, r.Body)
	}
	config, err := json.Marshal(map[string]any{"upstream": map[string]any{
		"installCmd": "cat > /opt/fetch.py <<'PY'\n" + mcpFetchServer + "PY\n",
		"runCmd":     "python3 /opt/fetch.py",
		"secrets":    map[string]any{"UPSTREAM_TOKEN": map[string]any{"secret": "mcp-upstream", "hosts": []string{"api.secret.test"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	sb := d.create(t, api.NewSandbox{TemplateID: "mcp-gateway", MCP: config,
		Network: &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"api.secret.test", "other.test"}}})
	e := sb.Envd()
	const token = "0b6c3e1e-1d2f-4b0a-9c55-3f1d2e4a5b6c"
	quoted := "'" + strings.ReplaceAll(string(config), "'", `'\''`) + "'"
	if _, errs, st := run(t, e.WithUser("root"), client.ProcessSpec{Cmd: "/bin/sh", Args: []string{"-c", "mcp-gateway --config " + quoted},
		Env: map[string]string{"GATEWAY_ACCESS_TOKEN": token}}); st.Code() != 0 {
		t.Fatalf("mcp-gateway --config: exit %d: %s", st.Code(), errs)
	}

	ctx := ctxT(t)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   d.URL + "/mcp",
		HTTPClient: &http.Client{Transport: sandboxPort{sb.ID(), "50005", "Bearer " + token}},
	}, nil)
	if err != nil {
		t.Fatalf("connecting to the gateway: %v", err)
	}
	defer cs.Close()
	fetch := func(url string) string {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"url": url}})
		if err != nil || len(res.Content) != 1 {
			t.Fatalf("fetch %s: %v, %v", url, res, err)
		}
		return res.Content[0].(*mcp.TextContent).Text
	}
	ph := strings.TrimSpace(sh(t, e, `printf %s "$UPSTREAM_TOKEN"`))
	if ph == "" || strings.Contains(ph, value) {
		t.Fatalf("UPSTREAM_TOKEN in the sandbox = %q, want a placeholder", ph)
	}

	m := fn.mark()
	out := fetch("https://api.secret.test/headers")
	saw := strings.Join(fn.since(m), "\n")
	if !strings.Contains(saw, value) {
		t.Errorf("the bound host did not get the real value: %q (tool said %q)", saw, out)
	}
	if strings.Contains(out, value) || !strings.Contains(out, ph) {
		t.Errorf("the tool got %q: want the placeholder back, never the value", out)
	}
	m = fn.mark()
	out = fetch("https://other.test/headers")
	if saw := strings.Join(fn.since(m), "\n"); strings.Contains(saw, value) || strings.Contains(saw, ph) {
		t.Errorf("an unbound host saw the token: %q (tool said %q)", saw, out)
	}
	neverHeld(t, e, value)

	// A wrong token is refused by the gateway.
	req, _ := http.NewRequestWithContext(context.Background(), "POST", d.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	res, err := (&http.Client{Transport: sandboxPort{sb.ID(), "50005", "Bearer wrong"}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d, want 401", res.StatusCode)
	}
}

// sandboxPort sends requests to a sandbox's port through the daemon, with
// an Authorization header.
type sandboxPort struct{ id, port, auth string }

func (s sandboxPort) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(api.HeaderSandboxID, s.id)
	r.Header.Set(api.HeaderSandboxPort, s.port)
	r.Header.Set("Authorization", s.auth)
	return http.DefaultTransport.RoundTrip(r)
}
