package daemon

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
	"github.com/fencesandbox/fence/internal/sandbox/idle"
	"github.com/fencesandbox/fence/internal/sshd"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// sshHostKeyFile is the SSH server's host key under the data dir.
const sshHostKeyFile = "ssh_host_ed25519_key"

// startSSH starts the SSH server on o.SSHAddr (when set) until ctx ends;
// the returned wait blocks until it stopped.
func (d *node) startSSH(ctx context.Context) (wait func(), err error) {
	o := d.opts
	if o.SSHAddr == "" {
		return func() {}, nil
	}
	srv, err := sshd.New(sshd.Config{
		HostKeyPath: filepath.Join(o.DataDir, sshHostKeyFile),
		Keys:        sshKeys{d.st},
		APIKey:      d.key,
		APIKeys:     sshAPIKeys(d.st),
		Sandboxes:   &sshSandboxes{mgr: d.mgr, nets: d.nets, idle: d.idle},
		Audit:       d.sources.sink,
		Logger:      d.log,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.SSHAddr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", o.SSHAddr, err)
	}
	fmt.Fprintf(d.out, "fence: serving SSH on %s (host key %s %s)\n", ln.Addr(), srv.HostKey().Type(), srv.Fingerprint())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx, ln); err != nil {
			d.log.Error("ssh server", "err", err)
		}
	}()
	return func() { <-done }, nil
}

// sshKeys finds registered keys in the store.
type sshKeys struct{ st *store.Store }

func (k sshKeys) LookupSSHKey(ctx context.Context, fp string) (sshd.Key, error) {
	key, err := k.st.SSHKeyByFingerprint(ctx, fp)
	if err != nil {
		return sshd.Key{}, err
	}
	return sshd.Key{ID: key.ID, Team: key.Team}, nil
}

// sshSandboxes opens live sandboxes for the SSH server: a paused one is
// resumed (Pauses.Connect) as E2B's connect does. A sandbox is in use
// (for the idle pause) from the connection's open to its end.
type sshSandboxes struct {
	mgr  *sandbox.Manager
	nets *fences.Set
	idle *idle.Tracker
}

func (s *sshSandboxes) Open(ctx context.Context, id string) (sshd.Target, error) {
	if !api.ValidSandboxID(id) {
		return nil, fmt.Errorf("sandbox %q: %w", id, api.ErrNotFound)
	}
	if _, _, err := s.mgr.Pauses().Connect(ctx, id, s.mgr.Defaults().Timeout, sandbox.WithMemory); err != nil {
		return nil, err
	}
	end := s.idle.Begin(id)
	info, box, err := s.mgr.Live(id)
	if err != nil {
		end()
		return nil, err
	}
	if info.State != sandbox.StateRunning {
		end()
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, info.State, api.ErrNotFound)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return box.DialAgent(ctx)
		},
		IdleConnTimeout:    30 * time.Second,
		DisableCompression: true,
	}
	return &sshTarget{id: id, nets: s.nets, tr: tr, end: end,
		envd: client.NewEnvd(&http.Client{Transport: tr}, "http://agent", nil)}, nil
}

// sshTarget reaches one sandbox: its agent directly (as the proxy does)
// and its ports through its fence.
type sshTarget struct {
	id   string
	nets *fences.Set
	tr   *http.Transport
	envd *client.Envd
	end  func() // the connection's use of the sandbox ends
}

func (t *sshTarget) Envd() *client.Envd { return t.envd }

// Close drops the connections to the agent the connection left idle.
func (t *sshTarget) Close() error {
	t.end()
	t.tr.CloseIdleConnections()
	return nil
}

func (t *sshTarget) DialPort(ctx context.Context, port uint16) (net.Conn, error) {
	return t.nets.DialPort(ctx, t.id, port)
}

// sshAPIKeys authenticates a team's API key given as an SSH password.
func sshAPIKeys(st *store.Store) func(ctx context.Context, key string) (tenancy.Principal, error) {
	return func(ctx context.Context, key string) (tenancy.Principal, error) {
		c, err := st.Authenticate(ctx, store.KindAPIKey, key)
		if err != nil {
			return tenancy.Principal{}, err
		}
		return c.Principal(), nil
	}
}
