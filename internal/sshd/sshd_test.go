package sshd_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/agent"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sshd"
)

// target is a sandbox stand-in: a real agent serving on loopback as this
// process's user, and ports that are loopback ports.
type target struct{ url string }

func (t target) Envd() *client.Envd { return client.NewEnvd(http.DefaultClient, t.url, nil) }
func (t target) DialPort(ctx context.Context, port uint16) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
}

type sandboxes struct{ t target }

func (s sandboxes) Open(_ context.Context, id string) (sshd.Target, error) {
	if id != "sb1" {
		return nil, errors.New("no such sandbox")
	}
	return s.t, nil
}

type keys map[string]string // fingerprint → key ID

func (k keys) LookupSSHKey(_ context.Context, fp string) (sshd.Key, error) {
	id, ok := k[fp]
	if !ok {
		return sshd.Key{}, errors.New("not found")
	}
	return sshd.Key{ID: id, Team: "t"}, nil
}

type sink struct {
	mu  sync.Mutex
	evs []audit.Event
}

func (s *sink) Append(_ context.Context, ev audit.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evs = append(s.evs, ev)
}

func (s *sink) ofType(typ string) []audit.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []audit.Event
	for _, ev := range s.evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

type fixture struct {
	url     string // the agent's
	addr    string
	signer  ssh.Signer
	srv     *sshd.Server
	sink    *sink
	keyPath string
}

func newSigner(t *testing.T) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func start(t *testing.T) *fixture {
	t.Helper()
	h, closeH := agent.NewHandler(agent.Options{Config: isolation.AgentConfig{DefaultWorkdir: t.TempDir()}})
	hs := httptest.NewServer(h)
	t.Cleanup(func() { hs.Close(); closeH() })
	f := &fixture{url: hs.URL, signer: newSigner(t), sink: &sink{}, keyPath: filepath.Join(t.TempDir(), "k", "host_key")}
	srv, err := sshd.New(sshd.Config{
		HostKeyPath: f.keyPath,
		Keys:        keys{ssh.FingerprintSHA256(f.signer.PublicKey()): "key1"},
		APIKey:      "e2b_secret",
		Sandboxes:   sandboxes{target{hs.URL}},
		Audit:       f.sink,
		SpoolDir:    t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	f.addr = ln.Addr().String()
	return f
}

func (f *fixture) envd() *client.Envd { return target{f.url}.Envd() }

func (f *fixture) dial(t *testing.T, user string, auth ...ssh.AuthMethod) (*ssh.Client, error) {
	t.Helper()
	c, err := ssh.Dial("tcp", f.addr, &ssh.ClientConfig{User: user, Auth: auth,
		HostKeyCallback: ssh.FixedHostKey(f.srv.HostKey())})
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

func (f *fixture) client(t *testing.T) *ssh.Client {
	t.Helper()
	c, err := f.dial(t, "sb1", ssh.PublicKeys(f.signer))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	return c
}

func TestExecExitCodes(t *testing.T) {
	f := start(t)
	c := f.client(t)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	s.Stdout, s.Stderr = &out, &errOut
	s.Stdin = strings.NewReader("in")
	err = s.Run("cat; echo; echo e >&2; exit 5")
	var ee *ssh.ExitError
	if !errors.As(err, &ee) || ee.ExitStatus() != 5 || out.String() != "in\n" || errOut.String() != "e\n" {
		t.Fatalf("Run = %v, out %q, err %q; want exit 5, in, e", err, out.String(), errOut.String())
	}
	s, _ = c.NewSession()
	if err := s.Run("true"); err != nil {
		t.Errorf("Run(true) = %v", err)
	}
	evs := f.sink.ofType(sshd.TypeExec)
	if len(evs) != 2 || evs[0].Data["command"] != "cat; echo; echo e >&2; exit 5" || evs[0].Data["exit_code"] != 5 ||
		evs[0].Actor != "team:t ssh-key:key1" || evs[0].SandboxID != "sb1" {
		t.Errorf("exec events = %+v", evs)
	}
}

func TestAuthentication(t *testing.T) {
	f := start(t)
	if _, err := f.dial(t, "sb1", ssh.PublicKeys(newSigner(t))); err == nil {
		t.Error("an unregistered key was accepted")
	}
	if _, err := f.dial(t, "sb1", ssh.Password("e2b_wrong")); err == nil {
		t.Error("a wrong password was accepted")
	}
	c, err := f.dial(t, "sb1", ssh.Password("e2b_secret"))
	if err != nil {
		t.Fatalf("the API key as password: %v", err)
	}
	s, _ := c.NewSession()
	if err := s.Run("true"); err != nil {
		t.Errorf("Run = %v", err)
	}
	// An unknown sandbox: authenticated, but every channel is refused.
	c, err = f.dial(t, "nosuch", ssh.PublicKeys(f.signer))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.NewSession(); err == nil {
		t.Error("a session opened on an unknown sandbox")
	}
}

func TestHostKeyPersists(t *testing.T) {
	f := start(t)
	fi, err := os.Stat(f.keyPath)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("host key: %v, %v; want mode 0600", fi, err)
	}
	again, err := sshd.LoadOrCreateHostKey(f.keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if got := ssh.FingerprintSHA256(again.PublicKey()); got != f.srv.Fingerprint() {
		t.Errorf("reloaded host key %s, want %s", got, f.srv.Fingerprint())
	}
	if err := os.WriteFile(f.keyPath, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := sshd.LoadOrCreateHostKey(f.keyPath); err == nil {
		t.Error("a corrupt host key was accepted (or replaced)")
	}
}

func TestSFTP(t *testing.T) {
	f := start(t)
	sc, err := sftp.NewClient(f.client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	dir := t.TempDir()
	data := make([]byte, 1<<20+3)
	rand.Read(data)
	w, err := sc.Create(filepath.Join(dir, "up"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.ReadFrom(bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("closing the upload: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "up")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("uploaded file: %d bytes, %v", len(got), err)
	}
	r, err := sc.Open(filepath.Join(dir, "up"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("download: %d bytes, %v", len(got), err)
	}
	if err := sc.Mkdir(filepath.Join(dir, "d")); err != nil {
		t.Fatal(err)
	}
	if err := sc.Rename(filepath.Join(dir, "up"), filepath.Join(dir, "d", "moved")); err != nil {
		t.Fatal(err)
	}
	entries, err := sc.ReadDir(filepath.Join(dir, "d"))
	if err != nil || len(entries) != 1 || entries[0].Name() != "moved" || entries[0].Size() != int64(len(data)) {
		t.Fatalf("ReadDir = %v, %v", entries, err)
	}
	if _, err := sc.Stat(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Stat(missing) = %v, want not exist", err)
	}
	var bytesMoved []any
	for _, ev := range f.sink.ofType(sshd.TypeSFTP) {
		bytesMoved = append(bytesMoved, ev.Data["op"], ev.Data["bytes"])
	}
	if len(bytesMoved) < 4 || bytesMoved[0] != "write" || bytesMoved[1] != int64(len(data)) ||
		bytesMoved[2] != "read" || bytesMoved[3] != int64(len(data)) {
		t.Errorf("sftp events = %v", bytesMoved)
	}
}

func TestSFTPBound(t *testing.T) {
	h, closeH := agent.NewHandler(agent.Options{Config: isolation.AgentConfig{DefaultWorkdir: t.TempDir()}})
	hs := httptest.NewServer(h)
	defer func() { hs.Close(); closeH() }()
	signer := newSigner(t)
	srv, err := sshd.New(sshd.Config{HostKeyPath: filepath.Join(t.TempDir(), "hk"),
		Keys: keys{ssh.FingerprintSHA256(signer.PublicKey()): "k"}, Sandboxes: sandboxes{target{hs.URL}},
		MaxFileBytes: 1000, SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx, ln)
	c, err := ssh.Dial("tcp", ln.Addr().String(), &ssh.ClientConfig{User: "sb1", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.FixedHostKey(srv.HostKey())})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := sftp.NewClient(c)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 5000), 0o644); err != nil {
		t.Fatal(err)
	}
	if r, err := sc.Open(big); err == nil {
		_, err = io.ReadAll(r)
		if err == nil {
			t.Error("a file over MaxFileBytes was downloaded")
		}
	}
	w, err := sc.Create(filepath.Join(dir, "up"))
	if err == nil {
		_, err = w.Write(make([]byte, 5000))
		if err == nil {
			err = w.Close()
		}
	}
	if err == nil {
		t.Error("a file over MaxFileBytes was uploaded")
	}
	if _, err := os.Stat(filepath.Join(dir, "up")); err == nil {
		t.Error("the refused upload left a file")
	}
}

func TestLocalForward(t *testing.T) {
	f := start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(io.LimitReader(c, 4))
		c.Write(append([]byte("echo:"), b...))
	}()
	c := f.client(t)
	conn, err := c.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("direct-tcpip: %v", err)
	}
	conn.Write([]byte("ping"))
	got, _ := io.ReadAll(conn)
	if string(got) != "echo:ping" {
		t.Errorf("forwarded = %q", got)
	}
	conn.Close()
	if _, err := c.Dial("tcp", "127.0.0.1:1"); err == nil {
		t.Error("a forward to a closed port succeeded")
	}
}

func TestMaxConns(t *testing.T) {
	signer := newSigner(t)
	srv, err := sshd.New(sshd.Config{HostKeyPath: filepath.Join(t.TempDir(), "hk"), MaxConns: 1,
		Keys: keys{ssh.FingerprintSHA256(signer.PublicKey()): "k"}, Sandboxes: sandboxes{}})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	defer func() { cancel(); <-done }()
	// One client that never authenticates holds the only slot.
	idle, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if _, err := io.ReadFull(idle, buf); err != nil { // the server's version line: it is served
		t.Fatal(err)
	}
	cfg := &ssh.ClientConfig{User: "sb1", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.FixedHostKey(srv.HostKey())}
	if c, err := ssh.Dial("tcp", ln.Addr().String(), cfg); err == nil {
		c.Close()
		t.Fatal("a connection over MaxConns was served")
	}
	idle.Close()
	var c *ssh.Client
	for range 500 { // the slot frees once the server sees the close
		if c, err = ssh.Dial("tcp", ln.Addr().String(), cfg); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("no connection once the slot was free: %v", err)
	}
	c.Close()
}

func TestServeEndsIdleConnections(t *testing.T) {
	signer := newSigner(t)
	srv, err := sshd.New(sshd.Config{HostKeyPath: filepath.Join(t.TempDir(), "hk"),
		Keys: keys{ssh.FingerprintSHA256(signer.PublicKey()): "k"}, Sandboxes: sandboxes{target{"http://127.0.0.1:1"}}})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	c, err := ssh.Dial("tcp", ln.Addr().String(), &ssh.ClientConfig{User: "sb1",
		Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: ssh.FixedHostKey(srv.HostKey())})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cancel()
	<-done // Serve returns although the client stays connected and idle
	if err := c.Wait(); err == nil {
		t.Error("the connection ended cleanly; want it cut")
	}
}

func TestDisconnectKillsTheCommand(t *testing.T) {
	f := start(t)
	c := f.client(t)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := s.StdoutPipe()
	if err := s.Start("echo started; exec sleep 1000"); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 8)
	if _, err := io.ReadFull(out, line); err != nil {
		t.Fatal(err)
	}
	e := f.envd()
	running := func() bool {
		ps, err := e.ListProcesses(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Cmd == "/bin/sh" && len(p.Args) == 2 && strings.Contains(p.Args[1], "sleep 1000") {
				return true
			}
		}
		return false
	}
	if !running() {
		t.Fatal("the command is not among the agent's processes")
	}
	c.Close()
	for range 500 {
		if !running() {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if running() {
		t.Error("the command outlived the connection")
	}
	for range 500 {
		if evs := f.sink.ofType(sshd.TypeExec); len(evs) == 1 && evs[0].Data["killed"] == "disconnected" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("exec events = %+v; want one killed on disconnect", f.sink.ofType(sshd.TypeExec))
}
