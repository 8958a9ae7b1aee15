// Package mcpgateway is fence's `mcp-gateway`, the command E2B's SDKs run
// in a sandbox of the mcp-gateway template when a create carries the `mcp`
// option: it installs and starts the configured MCP servers (each a
// command speaking MCP over stdio), gathers their tools into one MCP
// server and serves it over streamable HTTP on port 50005 at /mcp, to
// requests bearing the gateway's token.
//
// It is a role of the in-sandbox binary (template mcp-gateway links
// /usr/local/bin/mcp-gateway to /.fence/fence), so the gateway a sandbox
// runs is always the one of the fence that runs the sandbox.
//
// # Guarantees
//
//   - `mcp-gateway --config JSON` returns 0 only once every server is
//     installed, started and initialized and the listener is up; otherwise
//     it prints why on stderr and returns non-zero, leaving nothing
//     running.
//   - Every request to the listener without `Authorization: Bearer TOKEN`
//     (the token the command was started with, GATEWAY_ACCESS_TOKEN) is
//     refused with 401 before it reaches an MCP server.
//   - Tools keep their servers' names (as E2B's gateway does); two servers
//     offering the same tool name is a start error naming both.
//   - Servers never see the token: it is taken out of their environment.
//     Secret variables reach them as the placeholders the sandbox holds.
package mcpgateway

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const (
	// Port is where the gateway serves, as the SDKs' getMcpUrl() expects.
	Port = 50005
	// tokenEnv carries the token from the SDK to the command.
	tokenEnv = "GATEWAY_ACCESS_TOKEN"
	// npmRoot holds the packages of the npm form, one prefix each.
	npmRoot = "/opt/mcp-gateway/npm"
	// startTimeout bounds a server's start and initialization.
	startTimeout = 2 * time.Minute
)

// Paths, variables for tests.
var (
	// stateDir holds the token (read by the SDKs' getMcpToken() after a
	// connect), the configuration the serving process reads and its pid
	// (gateway.pid).
	stateDir = "/etc/mcp-gateway"
	// logFile receives the serving process's and the servers' stderr.
	logFile = "/var/log/mcp-gateway.log"
	// listenAddr is where the serving process listens.
	listenAddr = fmt.Sprintf(":%d", Port)
)

// Main runs `mcp-gateway ARGS` and returns the exit code.
func Main(args []string, stderr io.Writer) int {
	ctx := context.Background()
	var err error
	switch {
	case len(args) == 2 && args[0] == "--config":
		err = Start(ctx, []byte(args[1]), os.Getenv(tokenEnv), stderr)
	case len(args) == 1 && strings.HasPrefix(args[0], "--config="):
		err = Start(ctx, []byte(strings.TrimPrefix(args[0], "--config=")), os.Getenv(tokenEnv), stderr)
	case len(args) == 1 && args[0] == "serve":
		err = serveMain(ctx)
	case len(args) >= 1 && args[0] == "pull":
		err = Pull(ctx, args[1:], stderr)
	default:
		err = errors.New("usage: mcp-gateway --config JSON | mcp-gateway pull npm:PACKAGE[@VERSION] [...]")
	}
	if err != nil {
		fmt.Fprintln(stderr, "mcp-gateway:", err)
		return 1
	}
	return 0
}

// Start validates the configuration, stores it and the token under
// /etc/mcp-gateway, installs the servers and starts the serving process,
// returning once it serves (or why it could not).
func Start(ctx context.Context, config []byte, token string, stderr io.Writer) error {
	servers, err := ParseConfig(config)
	if err != nil {
		return err
	}
	if token == "" {
		return fmt.Errorf("%s is empty: the gateway serves no one without a token", tokenEnv)
	}
	for _, sv := range servers {
		for _, v := range sv.Secrets {
			if os.Getenv(v) == "" {
				return fmt.Errorf("server %q: secret variable %s is not bound in this sandbox (the daemon binds a server's secrets when the create's mcp option names them)", sv.Name, v)
			}
		}
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", stateDir, err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, ".token"), []byte(token), 0o600); err != nil {
		return fmt.Errorf("writing the token: %w", err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, "config.json"), config, 0o600); err != nil {
		return fmt.Errorf("writing the configuration: %w", err)
	}
	for i, s := range servers {
		if s.NPM != "" {
			if err := installNPM(ctx, s.NPM, stderr); err != nil {
				return fmt.Errorf("server %q: %w", s.Name, err)
			}
			continue
		}
		if s.InstallCmd == "" {
			continue
		}
		cmd := exec.CommandContext(ctx, "/bin/sh", "-c", s.InstallCmd)
		cmd.Env = serverEnv(servers[i])
		cmd.Dir = homeDir()
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("server %q: installCmd: %w\n%s", s.Name, err, tail(out))
		}
	}
	return spawnServe()
}

// spawnServe starts `mcp-gateway serve` in a session of its own, its
// output to the log file, and waits for its word on a pipe: "ok" once it
// serves, else why not.
func spawnServe() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the gateway's binary: %w", err)
	}
	log, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening %s: %w", logFile, err)
	}
	defer log.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(exe, "serve")
	cmd.Args[0] = "mcp-gateway"
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	err = cmd.Start()
	w.Close()
	if err != nil {
		return fmt.Errorf("starting the gateway: %w", err)
	}
	// One line: the servers it starts must not keep the pipe open (fd 3
	// is close-on-exec in the serving process), but a line needs no EOF.
	word, _ := bufio.NewReader(io.LimitReader(r, 64<<10)).ReadString('\n')
	if word == "ok\n" {
		return cmd.Process.Release()
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	msg := strings.TrimSpace(word)
	if msg == "" {
		msg = "the gateway exited before it served (see " + logFile + ")"
	}
	return errors.New(msg)
}

// serveMain is `mcp-gateway serve`: it starts the servers of the stored
// configuration, reports on fd 3 and serves until killed.
func serveMain(ctx context.Context) error {
	// fd 3 is the pipe to the starting command; the servers must not
	// inherit it.
	syscall.CloseOnExec(3)
	ready := os.NewFile(3, "ready")
	fail := func(err error) error {
		if ready != nil {
			// One line: the starting command reads up to a newline.
			fmt.Fprintln(ready, strings.ReplaceAll(err.Error(), "\n", " | "))
			ready.Close()
		}
		return err
	}
	config, err := os.ReadFile(filepath.Join(stateDir, "config.json"))
	if err != nil {
		return fail(err)
	}
	token, err := os.ReadFile(filepath.Join(stateDir, ".token"))
	if err != nil {
		return fail(err)
	}
	servers, err := ParseConfig(config)
	if err != nil {
		return fail(err)
	}
	g, err := Open(ctx, servers)
	if err != nil {
		return fail(err)
	}
	defer g.Close()
	ln, err := net.Listen("tcp", listenAddr)
	if err != nil {
		return fail(fmt.Errorf("listening on %s: %w", listenAddr, err))
	}
	if err := os.WriteFile(filepath.Join(stateDir, "gateway.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		return fail(err)
	}
	srv := &http.Server{Handler: g.Handler(string(token)), ReadHeaderTimeout: 10 * time.Second}
	if ready != nil {
		fmt.Fprintln(ready, "ok")
		ready.Close()
	}
	return srv.Serve(ln)
}

// Gateway is the aggregate of running servers' tools.
type Gateway struct {
	server   *mcp.Server
	sessions []*mcp.ClientSession
}

// Open starts every server, initializes a client session with each and
// gathers their tools. On error nothing it started is left running.
func Open(ctx context.Context, servers []Server) (_ *Gateway, err error) {
	g := &Gateway{server: mcp.NewServer(&mcp.Implementation{Name: "fence-mcp-gateway", Version: "1"}, nil)}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	owner := map[string]string{}
	client := mcp.NewClient(&mcp.Implementation{Name: "fence-mcp-gateway", Version: "1"}, nil)
	for _, s := range servers {
		run, err := runCmd(s)
		if err != nil {
			return nil, fmt.Errorf("server %q: %w", s.Name, err)
		}
		cmd := exec.Command("/bin/sh", "-c", run)
		cmd.Env = serverEnv(s)
		cmd.Dir = homeDir()
		cmd.Stderr = os.Stderr
		sctx, cancel := context.WithTimeout(ctx, startTimeout)
		cs, err := client.Connect(sctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("server %q: starting `%s`: %w", s.Name, run, err)
		}
		g.sessions = append(g.sessions, cs)
		for tool, err := range cs.Tools(sctx, nil) {
			if err != nil {
				cancel()
				return nil, fmt.Errorf("server %q: listing its tools: %w", s.Name, err)
			}
			if other, dup := owner[tool.Name]; dup {
				cancel()
				return nil, fmt.Errorf("servers %q and %q both offer a tool %q", other, s.Name, tool.Name)
			}
			owner[tool.Name] = s.Name
			if tool.InputSchema == nil {
				tool.InputSchema = map[string]any{"type": "object"}
			}
			if err := addTool(g.server, tool, forward(cs, tool.Name)); err != nil {
				cancel()
				return nil, fmt.Errorf("server %q: tool %q: %w", s.Name, tool.Name, err)
			}
		}
		cancel()
	}
	return g, nil
}

// addTool adds t to srv; the SDK panics on a tool whose input schema is
// not an object, which here is the server's fault, an error.
func addTool(srv *mcp.Server, t *mcp.Tool, h mcp.ToolHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	srv.AddTool(t, h)
	return nil
}

// forward is a tool handler that calls name on cs; a failed call is a
// tool error, not a protocol one.
func forward(cs *mcp.ClientSession, name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var args any
		if len(req.Params.Arguments) > 0 {
			args = req.Params.Arguments
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}, nil
		}
		return res, nil
	}
}

// Handler serves the gateway over streamable HTTP at /mcp to requests
// bearing token.
func (g *Gateway) Handler(token string) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server },
		// Requests arrive through fence's proxy with the sandbox host's
		// name; the token is what guards the gateway.
		&mcp.StreamableHTTPOptions{DisableLocalhostProtection: true})
	want := []byte("Bearer " + token)
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := []byte(r.Header.Get("Authorization")); subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mcp-gateway"`)
			http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Close ends every server's session (and so its process).
func (g *Gateway) Close() {
	for _, cs := range g.sessions {
		_ = cs.Close()
	}
}

// serverEnv is the gateway's environment without the token, plus the
// server's envs. Secret variables are in the sandbox's environment
// already (their placeholders).
func serverEnv(s Server) []string {
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k == tokenEnv {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range s.Envs {
		env = append(env, k+"="+v)
	}
	return env
}

// homeDir is where servers run: root's home, else /.
func homeDir() string {
	if h := os.Getenv("HOME"); h != "" {
		if fi, err := os.Stat(h); err == nil && fi.IsDir() {
			return h
		}
	}
	return "/"
}

// runCmd is the command that starts s: its runCmd, or its npm package's
// executable.
func runCmd(s Server) (string, error) {
	if s.NPM == "" {
		return s.RunCmd, nil
	}
	bin, err := npmBin(s.NPM)
	if err != nil {
		return "", err
	}
	q := []string{shellQuote(bin)}
	for _, a := range s.Args {
		q = append(q, shellQuote(a))
	}
	return strings.Join(q, " "), nil
}

// Pull installs npm packages ahead of time (E2B's Template.addMcpServer
// runs `mcp-gateway pull NAMES`): a create that names them starts at once.
func Pull(ctx context.Context, names []string, stderr io.Writer) error {
	if len(names) == 0 {
		return errors.New("pull: name npm:PACKAGE[@VERSION] servers to install")
	}
	for _, n := range names {
		spec, ok := strings.CutPrefix(n, "npm:")
		if !ok || !npmSpecRE.MatchString(spec) {
			return fmt.Errorf("pull %q: only npm:PACKAGE[@VERSION] is supported (catalog servers are not)", n)
		}
	}
	for _, n := range names {
		if err := installNPM(ctx, strings.TrimPrefix(n, "npm:"), stderr); err != nil {
			return err
		}
	}
	return nil
}

// installNPM installs spec into its own prefix under npmRoot, unless it is
// there already.
func installNPM(ctx context.Context, spec string, stderr io.Writer) error {
	if _, err := npmBin(spec); err == nil {
		return nil
	}
	dir := npmDir(spec)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("npm %s: %w", spec, err)
	}
	cmd := exec.CommandContext(ctx, "npm", "install", "--prefix", dir, "--no-audit", "--no-fund", "--", spec)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm install %s: %w\n%s", spec, err, tail(out))
	}
	_, err := npmBin(spec)
	return err
}

// npmBin is the executable of an installed npm package: its only bin, or
// the one named as the package.
func npmBin(spec string) (string, error) {
	name := npmName(spec)
	dir := npmDir(spec)
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", name, "package.json"))
	if err != nil {
		return "", fmt.Errorf("npm %s is not installed: %w", spec, err)
	}
	var pkg struct {
		Bin json.RawMessage `json:"bin"`
	}
	if err := json.Unmarshal(b, &pkg); err != nil {
		return "", fmt.Errorf("npm %s: its package.json: %w", spec, err)
	}
	base := name[strings.LastIndex(name, "/")+1:]
	var one string
	var many map[string]string
	switch {
	case json.Unmarshal(pkg.Bin, &one) == nil && one != "":
		return filepath.Join(dir, "node_modules", ".bin", base), nil
	case json.Unmarshal(pkg.Bin, &many) == nil && len(many) > 0:
		if _, ok := many[base]; ok {
			return filepath.Join(dir, "node_modules", ".bin", base), nil
		}
		if len(many) == 1 {
			for k := range many {
				return filepath.Join(dir, "node_modules", ".bin", k), nil
			}
		}
		return "", fmt.Errorf("npm %s has several executables and none named %s", spec, base)
	}
	return "", fmt.Errorf("npm %s has no executable (package.json bin)", spec)
}

// tail is the last lines of a command's output, for an error message.
func tail(out []byte) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
