package agent

import (
	"context"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fencesandbox/fence/api/envd/process/processconnect"
	"github.com/fencesandbox/fence/internal/agent/boot"
)

func TestServeUnixSocket(t *testing.T) {
	sock := t.TempDir() + "/agent.sock"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- Serve(ctx, ln, Options{Config: boot.Config{DefaultUser: "root", DefaultWorkdir: "/"}})
	}()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	resp, err := client.Get("http://agent/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("GET /health = %d, want 204", resp.StatusCode)
	}

	// SIGHUP does not end the agent (it is PID 1 in a sandbox).
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if resp, err = client.Get("http://agent/health"); err != nil {
		t.Fatalf("GET /health after SIGHUP: %v", err)
	}
	resp.Body.Close()

	// A stream open when the server stops is aborted, not left hanging.
	pc := processconnect.NewProcessClient(client, "http://agent", connect.WithProtoJSON())
	sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer scancel()
	st, err := pc.Start(sctx, connect.NewRequest(bash("sleep 100")))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() {
		t.Fatal(st.Err())
	}
	pid := int(st.Msg().GetEvent().GetStart().GetPid())
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Serve = %v, want nil after cancel", err)
	}
	for st.Receive() {
	}
	if st.Err() == nil {
		t.Error("stream ended cleanly after the server stopped; want an error")
	}
	waitGone(t, pid) // Serve kills what it started
}

// An agent whose handler and services were made ahead (Build, before its
// sandbox's configuration was known) serves with the configuration given
// to Serve: its environment and its default user and workdir.
func TestServeBuiltAhead(t *testing.T) {
	sock := t.TempDir() + "/agent.sock"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	built := Build(Options{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- Serve(ctx, ln, Options{Built: built, Config: boot.Config{
			EnvVars: map[string]string{"AHEAD": "set at serve"}, DefaultUser: "root", DefaultWorkdir: "/tmp"}})
	}()
	defer func() {
		cancel()
		<-errc
	}()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	pc := processconnect.NewProcessClient(client, "http://agent", connect.WithProtoJSON())
	st, err := pc.Start(context.Background(), connect.NewRequest(bash(`echo "$AHEAD:$(id -u):$(pwd)"`)))
	if err != nil {
		t.Fatal(err)
	}
	var out string
	for st.Receive() {
		out += string(st.Msg().GetEvent().GetData().GetStdout())
	}
	if want := "set at serve:0:/tmp\n"; out != want {
		t.Errorf("a command of an agent built ahead printed %q, want %q (%v)", out, want, st.Err())
	}
}
