// Package sshd is fence's SSH server: `ssh <sandboxID>@host -p PORT` gives
// a shell, exec, SFTP and local port forwarding into a sandbox that runs
// no SSH server itself.
//
// # Guarantees
//
//   - A client authenticates by a public key registered with the API
//     (Keys), or by an API key as its password: the daemon's (the default
//     team's admin) or a team's live one (APIKeys), which reaches its
//     team's sandboxes alone (another team's is a missing one). A
//     revoked, unknown or auditor key is refused, as is anything else,
//     before a sandbox is looked at.
//   - The user name is the sandbox ID; a paused sandbox is resumed on
//     connect (Sandboxes.Open). An unknown sandbox ends the connection.
//   - Shells and commands run through the sandbox's agent as the
//     template's default user; the client gets their exit code (or signal).
//     One still running when the connection ends is killed.
//   - SFTP runs in the daemon over the agent's filesystem API; each file
//     is spooled through a host temporary file bounded by MaxFileBytes.
//   - direct-tcpip (ssh -L) reaches the sandbox's ports through its fence,
//     never anything else.
//   - At most MaxConns connections are served at once; a client has 30 s
//     to authenticate.
//   - Every connection, command, SFTP transfer and forward is an audit
//     event (who, which sandbox, what).
package sshd

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/subtle"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Audit event types of the SSH server.
const (
	TypeSession = "ssh.session" // a connection: actor, auth, remote address; at its end, duration
	TypeExec    = "ssh.exec"    // a shell or command: command, pty, exit code or signal
	TypeSFTP    = "ssh.sftp"    // a file read or written: op, path, bytes
	TypeForward = "ssh.forward" // a direct-tcpip forward: port, bytes each way
)

// Key is a registered public key as the server needs it.
type Key struct {
	ID   string
	Team string
}

// Keys finds registered public keys by their SHA256 fingerprint
// (ssh.FingerprintSHA256). A missing key gives an error.
type Keys interface {
	LookupSSHKey(ctx context.Context, fingerprint string) (Key, error)
}

// Target is a running sandbox as a session reaches it. If it is also an
// io.Closer, it is closed when the connection ends.
type Target interface {
	// Envd is a client of the sandbox's agent.
	Envd() *client.Envd
	// DialPort connects to a port of the sandbox through its fence.
	DialPort(ctx context.Context, port uint16) (net.Conn, error)
}

// Sandboxes opens sandboxes for sessions: a paused one is resumed; an
// unknown or killed one gives an error.
type Sandboxes interface {
	Open(ctx context.Context, id string) (Target, error)
}

// Config configures a Server.
type Config struct {
	// HostKeyPath holds the server's ed25519 host key (PEM, mode 0600);
	// it is created when missing. Required.
	HostKeyPath string
	// Keys are the registered public keys; nil refuses public keys.
	Keys Keys
	// APIKey is accepted as the password; "" refuses passwords.
	APIKey string
	// APIKeys, if set, authenticates a team's API key given as the
	// password: its principal, or an error for an unknown, malformed or
	// revoked key.
	APIKeys func(ctx context.Context, key string) (tenancy.Principal, error)
	// Sandboxes opens the sandbox a connection names. Required.
	Sandboxes Sandboxes
	// Audit receives the sessions' events; nil records nothing.
	Audit audit.Sink
	// Logger; nil discards logs.
	Logger *slog.Logger
	// MaxFileBytes bounds one file moved by SFTP; zero means 1 GiB.
	MaxFileBytes int64
	// SpoolDir holds SFTP's temporary files; "" is os.TempDir().
	SpoolDir string
	// MaxConns bounds the connections served at once, authenticated or
	// not; more are closed on accept. Zero means 256.
	MaxConns int
}

// Server serves SSH connections.
type Server struct {
	cfg      Config
	conf     *ssh.ServerConfig
	hostKey  ssh.Signer
	log      *slog.Logger
	sink     audit.Sink
	keyActor string
	slots    chan struct{} // a slot per connection served
	wg       sync.WaitGroup
}

// New loads (or creates) the host key and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Sandboxes == nil {
		return nil, errors.New("sshd: no Sandboxes")
	}
	signer, err := LoadOrCreateHostKey(cfg.HostKeyPath)
	if err != nil {
		return nil, err
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = 1 << 30
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 256
	}
	s := &Server{cfg: cfg, hostKey: signer, log: cfg.Logger, sink: cfg.Audit, keyActor: audit.KeyActor(cfg.APIKey),
		slots: make(chan struct{}, cfg.MaxConns)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.sink == nil {
		s.sink = audit.Discard{}
	}
	s.conf = &ssh.ServerConfig{
		PublicKeyCallback: s.checkPublicKey,
		PasswordCallback:  s.checkPassword,
		MaxAuthTries:      6,
		ServerVersion:     "SSH-2.0-fence",
	}
	s.conf.AddHostKey(signer)
	return s, nil
}

// Fingerprint is the host key's SHA256 fingerprint, as ssh prints it.
func (s *Server) Fingerprint() string { return ssh.FingerprintSHA256(s.hostKey.PublicKey()) }

// HostKey is the host key's public half.
func (s *Server) HostKey() ssh.PublicKey { return s.hostKey.PublicKey() }

// LoadOrCreateHostKey reads the ed25519 host key at path, or creates one
// there (mode 0600, its directory 0700) when the file does not exist.
func LoadOrCreateHostKey(path string) (ssh.Signer, error) {
	if path == "" {
		return nil, errors.New("sshd: no host key path")
	}
	b, err := os.ReadFile(path)
	if err == nil {
		signer, err := ssh.ParsePrivateKey(b)
		if err != nil {
			return nil, fmt.Errorf("sshd: reading host key %s: %w", path, err)
		}
		return signer, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sshd: reading host key: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "fence ssh host key")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("sshd: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, fmt.Errorf("sshd: writing host key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("sshd: writing host key: %w", err)
	}
	return ssh.NewSignerFromKey(priv)
}

const (
	extActor = "fence-actor"
	extAuth  = "fence-auth"
	extKeyID = "fence-key-id"
	extTeam  = "fence-team"
	extAdmin = "fence-admin"
)

func (s *Server) checkPublicKey(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
	if s.cfg.Keys == nil {
		return nil, errors.New("no public keys are registered")
	}
	fp := ssh.FingerprintSHA256(key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k, err := s.cfg.Keys.LookupSSHKey(ctx, fp)
	if err != nil {
		return nil, fmt.Errorf("public key %s is not registered", fp)
	}
	team := k.Team
	if team == "" {
		team = tenancy.DefaultTeamID
	}
	return &ssh.Permissions{Extensions: map[string]string{
		extActor: "team:" + team + " ssh-key:" + k.ID, extAuth: "publickey", extKeyID: k.ID, extTeam: team}}, nil
}

func (s *Server) checkPassword(meta ssh.ConnMetadata, password []byte) (*ssh.Permissions, error) {
	if s.cfg.APIKey != "" && subtle.ConstantTimeCompare(password, []byte(s.cfg.APIKey)) == 1 {
		return &ssh.Permissions{Extensions: map[string]string{extActor: s.keyActor, extAuth: "password",
			extTeam: tenancy.DefaultTeamID, extAdmin: "1"}}, nil
	}
	if s.cfg.APIKeys == nil {
		return nil, errors.New("wrong password")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := s.cfg.APIKeys(ctx, string(password))
	if err != nil || p.Team == "" || p.Auditor {
		return nil, errors.New("wrong password")
	}
	return &ssh.Permissions{Extensions: map[string]string{extActor: "team:" + p.Team + " key:" + p.KeyID,
		extAuth: "password", extKeyID: p.KeyID, extTeam: p.Team}}, nil
}

// Serve accepts connections on ln until ctx ends, then closes ln and the
// connections, and waits for their goroutines to end.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer s.wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		select {
		case s.slots <- struct{}{}:
		default:
			s.log.Warn("ssh connection refused: too many connections", "remote", c.RemoteAddr().String(), "max", cap(s.slots))
			c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.slots }()
			s.serveConn(ctx, c)
		}()
	}
}

// handshakeTimeout bounds a client's handshake and authentication.
const handshakeTimeout = 30 * time.Second

func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	// The server's end ends every connection, idle ones included.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	sc, chans, reqs, err := ssh.NewServerConn(c, s.conf)
	if err != nil {
		s.log.Debug("ssh handshake", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	_ = c.SetDeadline(time.Time{})
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = sc.Wait()
		cancel()
	}()
	id := sc.User()
	actor := sc.Permissions.Extensions[extActor]
	data := map[string]any{"auth": sc.Permissions.Extensions[extAuth], "remote": c.RemoteAddr().String()}
	if k := sc.Permissions.Extensions[extKeyID]; k != "" {
		data["key_id"] = k
	}
	// The connection acts for its key's team: another team's sandbox is
	// a missing one.
	ctx = tenancy.NewContext(ctx, tenancy.Principal{Team: sc.Permissions.Extensions[extTeam],
		KeyID: cmp.Or(sc.Permissions.Extensions[extKeyID], tenancy.BootstrapKeyID),
		Admin: sc.Permissions.Extensions[extAdmin] == "1"})
	t, err := s.cfg.Sandboxes.Open(ctx, id)
	if err != nil {
		data["error"] = err.Error()
		s.sink.Append(context.WithoutCancel(ctx), audit.Event{Type: TypeSession, SandboxID: id, Actor: actor, Data: data})
		s.log.Info("ssh connection for a sandbox that cannot be opened", "sandbox_id", id, "err", err)
		// The client learns of it on its first channel.
		for ch := range chans {
			_ = ch.Reject(ssh.ConnectionFailed, "sandbox "+id+" is not available: "+err.Error())
			return
		}
		return
	}
	start := time.Now()
	s.sink.Append(context.WithoutCancel(ctx), audit.Event{Type: TypeSession, SandboxID: id, Actor: actor, Data: data})
	if c, ok := t.(io.Closer); ok {
		defer c.Close()
	}
	sess := &conn{s: s, id: id, actor: actor, t: t}
	var wg sync.WaitGroup
	for nc := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sess.channel(ctx, nc)
		}()
	}
	cancel()
	wg.Wait()
	s.sink.Append(context.WithoutCancel(ctx), audit.Event{Type: TypeSession, SandboxID: id, Actor: actor,
		Data: map[string]any{"end": true, "duration_ms": time.Since(start).Milliseconds()}})
}

// conn is one authenticated connection to one sandbox.
type conn struct {
	s     *Server
	id    string
	actor string
	t     Target
}

func (c *conn) event(ctx context.Context, typ string, data map[string]any) {
	c.s.sink.Append(context.WithoutCancel(ctx), audit.Event{Type: typ, SandboxID: c.id, Actor: c.actor, Data: data})
}

func (c *conn) channel(ctx context.Context, nc ssh.NewChannel) {
	switch nc.ChannelType() {
	case "session":
		ch, reqs, err := nc.Accept()
		if err != nil {
			return
		}
		c.session(ctx, ch, reqs)
	case "direct-tcpip":
		c.forward(ctx, nc)
	default:
		_ = nc.Reject(ssh.UnknownChannelType, "unsupported channel type")
	}
}

// forward serves ssh -L: a connection to a port of the sandbox.
func (c *conn) forward(ctx context.Context, nc ssh.NewChannel) {
	var p struct {
		Host       string
		Port       uint32
		OriginHost string
		OriginPort uint32
	}
	if err := ssh.Unmarshal(nc.ExtraData(), &p); err != nil {
		_ = nc.Reject(ssh.ConnectionFailed, "bad direct-tcpip request")
		return
	}
	if p.Port == 0 || p.Port > 65535 {
		_ = nc.Reject(ssh.ConnectionFailed, "bad port")
		return
	}
	// Whatever the host, the target is the sandbox itself.
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	up, err := c.t.DialPort(dctx, uint16(p.Port))
	cancel()
	if err != nil {
		c.event(ctx, TypeForward, map[string]any{"port": p.Port, "error": err.Error()})
		_ = nc.Reject(ssh.ConnectionFailed, fmt.Sprintf("port %d of the sandbox: %v", p.Port, err))
		return
	}
	defer up.Close()
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	go ssh.DiscardRequests(reqs)
	var in, out int64
	done := make(chan struct{})
	go func() {
		in, _ = io.Copy(up, ch)
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		close(done)
	}()
	out, _ = io.Copy(ch, up)
	_ = ch.CloseWrite()
	select {
	case <-done:
	case <-ctx.Done():
	}
	_ = ch.Close()
	<-done
	c.event(ctx, TypeForward, map[string]any{"port": p.Port, "bytes_in": in, "bytes_out": out})
}
