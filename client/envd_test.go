package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/client/clienttest"
)

// newSandbox returns a fake daemon, a sandbox in it and the sandbox's agent.
func newSandbox(t *testing.T) (*client.Sandbox, *clienttest.Agent) {
	t.Helper()
	srv, c := newClient(t)
	sb, err := c.Create(t.Context(), api.NewSandbox{TemplateID: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	return sb, srv.Agent(sb.ID())
}

func lastAgentRequest(t *testing.T, a *clienttest.Agent, path string) clienttest.Request {
	t.Helper()
	reqs := a.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if reqs[i].Path == path {
			return reqs[i]
		}
	}
	t.Fatalf("agent received no request for %s", path)
	return clienttest.Request{}
}

func TestRunThroughDaemon(t *testing.T) {
	sb, agent := newSandbox(t)
	var out, errb bytes.Buffer
	st, err := sb.Envd().Run(t.Context(), client.ProcessSpec{Cmd: "echo", Args: []string{"hello", "world"}, User: "root", Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("Run(echo) = %v", err)
	}
	if out.String() != "hello world\n" || errb.Len() != 0 || st.Code() != 0 || !st.Exited {
		t.Errorf("Run(echo) = %+v, stdout %q, stderr %q; want exit 0 and stdout \"hello world\\n\"", st, out.String(), errb.String())
	}
	r := lastAgentRequest(t, agent, "/process.Process/Start")
	want := map[string]string{
		"E2b-Sandbox-Id":           sb.ID(),
		"E2b-Sandbox-Port":         "49983",
		"X-Access-Token":           sb.EnvdAccessToken,
		"Authorization":            "Basic cm9vdDo=", // base64("root:")
		"Keepalive-Ping-Interval":  "50",
		"Content-Type":             "application/connect+json",
		"Connect-Protocol-Version": "1",
	}
	for k, v := range want {
		if got := r.Header.Get(k); got != v {
			t.Errorf("Start sent %s: %q, want %q", k, got, v)
		}
	}
}

func TestExitStatus(t *testing.T) {
	sb, _ := newSandbox(t)
	e := sb.Envd()
	tests := []struct {
		argv     []string
		wantCode int
		wantSig  syscall.Signal
	}{
		{[]string{"exit", "0"}, 0, 0},
		{[]string{"exit", "3"}, 3, 0},
		{[]string{"kill"}, 137, syscall.SIGKILL},
	}
	for _, tt := range tests {
		st, err := e.Run(t.Context(), client.ProcessSpec{Cmd: tt.argv[0], Args: tt.argv[1:]})
		if err != nil {
			t.Fatalf("Run(%v) = %v", tt.argv, err)
		}
		sig, _ := st.Signal()
		if st.Code() != tt.wantCode || sig != tt.wantSig {
			t.Errorf("Run(%v) = code %d signal %v, want %d %v", tt.argv, st.Code(), sig, tt.wantCode, tt.wantSig)
		}
	}
}

func TestExitStatusCode(t *testing.T) {
	tests := []struct {
		st   client.ExitStatus
		want int
	}{
		{client.ExitStatus{ExitCode: 0, Exited: true, Status: "exit status 0"}, 0},
		{client.ExitStatus{ExitCode: 42, Exited: true, Status: "exit status 42"}, 42},
		{client.ExitStatus{ExitCode: -1, Status: "signal: terminated"}, 143},
		{client.ExitStatus{ExitCode: -1, Status: "signal: segmentation fault (core dumped)"}, 139},
		{client.ExitStatus{ExitCode: -1, Status: "weird"}, 255},
	}
	for _, tt := range tests {
		if got := tt.st.Code(); got != tt.want {
			t.Errorf("%+v.Code() = %d, want %d", tt.st, got, tt.want)
		}
	}
}

func TestStdinAndSignals(t *testing.T) {
	sb, agent := newSandbox(t)
	e := sb.Envd()
	var out bytes.Buffer
	p, err := e.Start(t.Context(), client.ProcessSpec{Cmd: "cat", Stdin: true, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if p.PID == 0 {
		t.Errorf("Start(cat).PID = 0, want the agent's PID")
	}
	procs, err := e.ListProcesses(t.Context())
	if err != nil || len(procs) != 1 || procs[0].PID != p.PID || procs[0].Cmd != "cat" {
		t.Errorf("ListProcesses = %+v, %v; want cat with PID %d", procs, err, p.PID)
	}
	for _, s := range []string{"a", "b\n"} {
		if err := p.SendStdin(t.Context(), []byte(s)); err != nil {
			t.Fatalf("SendStdin = %v", err)
		}
	}
	if err := p.CloseStdin(t.Context()); err != nil {
		t.Fatalf("CloseStdin = %v", err)
	}
	st, err := p.Wait()
	if err != nil || st.Code() != 0 || out.String() != "ab\n" {
		t.Errorf("cat Wait = %+v, %v, output %q; want 0 and \"ab\\n\"", st, err, out.String())
	}
	if r := lastAgentRequest(t, agent, "/process.Process/SendInput"); r.Header.Get("X-Access-Token") != sb.EnvdAccessToken {
		t.Errorf("SendInput sent no access token")
	}

	p, err = e.Start(t.Context(), client.ProcessSpec{Cmd: "sleep"})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(t.Context(), syscall.SIGTERM); err != nil {
		t.Fatalf("Signal = %v", err)
	}
	if st, err := p.Wait(); err != nil || st.Code() != 128+15 {
		t.Errorf("sleep after SIGTERM: Wait = %+v, %v; want code 143", st, err)
	}
	if err := p.Signal(t.Context(), syscall.SIGKILL); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Signal after exit = %v, want api.ErrNotFound", err)
	}
}

func TestPTY(t *testing.T) {
	sb, _ := newSandbox(t)
	e := sb.Envd()
	var out bytes.Buffer
	st, err := e.Run(t.Context(), client.ProcessSpec{Cmd: "size", PTY: &client.PTYSize{Cols: 80, Rows: 24}, Stdout: &out})
	if err != nil || st.Code() != 0 || out.String() != "80 24\n" {
		t.Errorf("Run(size, PTY 80x24) = %+v, %v, %q; want \"80 24\\n\"", st, err, out.String())
	}
	out.Reset()
	p, err := e.Start(t.Context(), client.ProcessSpec{Cmd: "cat", PTY: &client.PTYSize{Cols: 80, Rows: 24}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Resize(t.Context(), client.PTYSize{Cols: 100, Rows: 30}); err != nil {
		t.Errorf("Resize = %v", err)
	}
	// The fake refuses stdin input (rather than pty input) for a PTY process.
	if err := p.SendStdin(t.Context(), []byte("typed\x04")); err != nil {
		t.Errorf("SendStdin(PTY) = %v", err)
	}
	if _, err := p.Wait(); err != nil || out.String() != "typed" {
		t.Errorf("PTY cat output = %q, %v; want \"typed\"", out.String(), err)
	}
}

func TestProcessErrors(t *testing.T) {
	sb, _ := newSandbox(t)
	e := sb.Envd()
	_, err := e.Start(t.Context(), client.ProcessSpec{Cmd: "nosuch"})
	if !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("Start(nosuch) = %v, want api.ErrInvalidArgument", err)
	}
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument {
		t.Errorf("Start(nosuch) = %v, want a *connect.Error invalid_argument in the chain", err)
	}
	if _, err := e.ConnectProcess(t.Context(), 4242, nil, nil); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("ConnectProcess(4242) = %v, want api.ErrNotFound", err)
	}
	bad := sb.Envd()
	sb.EnvdAccessToken = "wrong"
	if _, err := sb.Envd().Run(t.Context(), client.ProcessSpec{Cmd: "echo"}); !errors.Is(err, api.ErrPermissionDenied) {
		t.Errorf("Run with a wrong token = %v, want api.ErrPermissionDenied", err)
	}
	sb.SandboxID = "gone"
	if _, err := sb.Envd().Run(t.Context(), client.ProcessSpec{Cmd: "echo"}); !errors.Is(err, api.ErrUnavailable) {
		t.Errorf("Run in an unknown sandbox = %v, want api.ErrUnavailable (proxy 502)", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	p, err := bad.Start(ctx, client.ProcessSpec{Cmd: "sleep"})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := p.Wait(); err == nil {
		t.Errorf("Wait after cancelling the stream = nil error, want an error")
	}
}

func TestConnectProcess(t *testing.T) {
	sb, agent := newSandbox(t)
	e := sb.Envd()
	p, err := e.Start(t.Context(), client.ProcessSpec{Cmd: "sleep"})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := e.ConnectProcess(t.Context(), p.PID, nil, nil)
	if err != nil {
		t.Fatalf("ConnectProcess(%d) = %v", p.PID, err)
	}
	if r := lastAgentRequest(t, agent, "/process.Process/Connect"); r.Header.Get("Keepalive-Ping-Interval") != "50" {
		t.Errorf("Connect sent Keepalive-Ping-Interval %q, want 50", r.Header.Get("Keepalive-Ping-Interval"))
	}
	if err := p2.Signal(t.Context(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, proc := range []*client.Process{p, p2} {
		if st, err := proc.Wait(); err != nil || st.Code() != 137 {
			t.Errorf("Wait = %+v, %v; want 137", st, err)
		}
	}
}

func TestFiles(t *testing.T) {
	sb, agent := newSandbox(t)
	e := sb.Envd().WithUser("root")
	ctx := t.Context()
	if err := e.WriteFile(ctx, "dir/a.txt", strings.NewReader("data")); err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	r := lastAgentRequest(t, agent, "/files")
	if r.Method != "POST" || r.Query.Get("path") != "dir/a.txt" || r.Query.Get("username") != "root" ||
		r.Header.Get("Content-Type") != "application/octet-stream" || string(r.Body) != "data" {
		t.Errorf("WriteFile sent %s %v %q content-type %q", r.Method, r.Query, r.Body, r.Header.Get("Content-Type"))
	}
	if got, _ := agent.File("/root/dir/a.txt"); string(got) != "data" {
		t.Errorf("file after WriteFile = %q, want data", got)
	}
	rc, err := e.ReadFile(ctx, "/root/dir/a.txt")
	if err != nil {
		t.Fatalf("ReadFile = %v", err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "data" {
		t.Errorf("ReadFile = %q, want data", b)
	}
	if _, err := e.ReadFile(ctx, "/nope"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("ReadFile(/nope) = %v, want api.ErrNotFound", err)
	}
	info, err := e.Stat(ctx, "/root/dir/a.txt")
	if err != nil || info.Type != client.TypeFile || info.Size != 4 || info.Mode != 0o644 || info.Name != "a.txt" || info.ModTime.IsZero() {
		t.Errorf("Stat = %+v, %v", info, err)
	}
	if _, err := e.Stat(ctx, "/nope"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Stat(/nope) = %v, want api.ErrNotFound", err)
	}
	if _, err := e.MakeDir(ctx, "/root/dir"); !errors.Is(err, api.ErrConflict) {
		t.Errorf("MakeDir(existing) = %v, want api.ErrConflict", err)
	}
	if d, err := e.MakeDir(ctx, "/root/dir/sub"); err != nil || d.Type != client.TypeDir {
		t.Errorf("MakeDir = %+v, %v", d, err)
	}
	if m, err := e.Move(ctx, "/root/dir/a.txt", "/root/dir/b.txt"); err != nil || m.Path != "/root/dir/b.txt" {
		t.Errorf("Move = %+v, %v", m, err)
	}
	entries, err := e.ListDir(ctx, "/root/dir", 1)
	if err != nil || len(entries) != 2 || entries[0].Name != "b.txt" || entries[1].Type != client.TypeDir {
		t.Errorf("ListDir = %+v, %v; want b.txt and sub", entries, err)
	}
	if err := e.Remove(ctx, "/root/dir"); err != nil {
		t.Errorf("Remove = %v", err)
	}
	if _, err := e.Stat(ctx, "/root/dir/b.txt"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Stat after Remove = %v, want api.ErrNotFound", err)
	}
}

// TestDirectEnvd reaches an agent over a custom dialer with no routing
// headers, as `fence run` does.
func TestDirectEnvd(t *testing.T) {
	agent := clienttest.NewAgent()
	srv := httptest.NewServer(agent)
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}}}
	defer hc.CloseIdleConnections()
	e := client.NewEnvd(hc, "http://agent", nil)
	var out bytes.Buffer
	st, err := e.Run(t.Context(), client.ProcessSpec{Cmd: "pwd", Cwd: "/tmp", Stdout: &out})
	if err != nil || st.Code() != 0 || out.String() != "/tmp\n" {
		t.Errorf("Run(pwd) = %+v, %v, %q; want /tmp", st, err, out.String())
	}
	r := lastAgentRequest(t, agent, "/process.Process/Start")
	if r.Header.Get("E2b-Sandbox-Id") != "" || r.Header.Get("Authorization") != "" {
		t.Errorf("direct Start sent routing or user headers: %v", r.Header)
	}
}
