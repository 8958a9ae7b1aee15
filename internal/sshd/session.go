package sshd

import (
	"context"
	"errors"
	"io"
	"syscall"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/fencesandbox/fence/client"
)

// loginShell starts the user's shell: bash when the template has it.
const loginShell = `if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh -l`

// maxEnv bounds the environment variables a client may send.
const maxEnv = 64

// session serves one session channel: env and pty-req, then one of
// shell, exec or the sftp subsystem.
func (c *conn) session(ctx context.Context, ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	env := map[string]string{}
	var pty *client.PTYSize
	term := ""
	for req := range reqs {
		switch req.Type {
		case "env":
			var kv struct{ Name, Value string }
			if ssh.Unmarshal(req.Payload, &kv) != nil || len(env) >= maxEnv || kv.Name == "" {
				_ = req.Reply(false, nil)
				continue
			}
			env[kv.Name] = kv.Value
			_ = req.Reply(true, nil)
		case "pty-req":
			var p struct {
				Term          string
				Cols, Rows    uint32
				Width, Height uint32
				Modes         string
			}
			if ssh.Unmarshal(req.Payload, &p) != nil {
				_ = req.Reply(false, nil)
				continue
			}
			pty = &client.PTYSize{Cols: clamp(p.Cols, 80), Rows: clamp(p.Rows, 24)}
			term = p.Term
			_ = req.Reply(true, nil)
		case "shell", "exec":
			var cmd string
			if req.Type == "exec" {
				var e struct{ Command string }
				if ssh.Unmarshal(req.Payload, &e) != nil {
					_ = req.Reply(false, nil)
					continue
				}
				cmd = e.Command
			}
			if term != "" {
				env["TERM"] = term
			}
			_ = req.Reply(true, nil)
			c.run(ctx, ch, reqs, cmd, req.Type == "shell", pty, env)
			return
		case "subsystem":
			var sub struct{ Name string }
			if ssh.Unmarshal(req.Payload, &sub) != nil || sub.Name != "sftp" {
				_ = req.Reply(false, nil)
				continue
			}
			_ = req.Reply(true, nil)
			go ssh.DiscardRequests(reqs)
			c.sftp(ctx, ch)
			return
		default:
			if req.WantReply {
				_ = req.Reply(false, nil)
			}
		}
	}
}

func clamp(v uint32, def uint16) uint16 {
	if v == 0 {
		return def
	}
	if v > 1000 {
		return 1000
	}
	return uint16(v)
}

// run runs a shell (cmd "") or a command in the sandbox, connects it to
// ch and reports its exit status.
func (c *conn) run(ctx context.Context, ch ssh.Channel, reqs <-chan *ssh.Request, cmd string, shell bool, pty *client.PTYSize, env map[string]string) {
	spec := client.ProcessSpec{Cmd: "/bin/sh", Args: []string{"-c", cmd}, Env: env, PTY: pty, Stdin: true,
		Stdout: ch, Stderr: ch.Stderr()}
	if shell {
		spec.Args = []string{"-c", loginShell}
	}
	if pty != nil {
		// A terminal has one stream.
		spec.Stderr = ch
	}
	data := map[string]any{"pty": pty != nil}
	if shell {
		data["shell"] = true
	} else {
		data["command"] = cmd
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	e := c.t.Envd()
	p, err := e.Start(pctx, spec)
	if err != nil {
		data["error"] = err.Error()
		c.event(ctx, TypeExec, data)
		_, _ = io.WriteString(ch.Stderr(), "fence: "+err.Error()+"\r\n")
		sendExit(ch, 255)
		return
	}
	data["pid"] = p.PID
	go c.control(pctx, p, reqs)
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := ch.Read(buf)
			if n > 0 {
				if p.SendStdin(pctx, buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) && pty == nil {
					_ = p.CloseStdin(pctx)
				}
				return
			}
		}
	}()
	st, err := p.Wait()
	if err != nil {
		data["error"] = err.Error()
		if ctx.Err() != nil {
			// The client left: what it started does not outlive it.
			kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			if kerr := p.Signal(kctx, syscall.SIGKILL); kerr == nil {
				data["killed"] = "disconnected"
			}
			kcancel()
		}
		c.event(ctx, TypeExec, data)
		sendExit(ch, 255)
		return
	}
	if sig, ok := st.Signal(); ok {
		data["signal"] = sig.String()
		c.event(ctx, TypeExec, data)
		_, _ = ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
			Signal     string
			CoreDumped bool
			Msg, Lang  string
		}{Signal: sshSignalName(sig)}))
		return
	}
	data["exit_code"] = st.Code()
	c.event(ctx, TypeExec, data)
	sendExit(ch, st.Code())
}

func sendExit(ch ssh.Channel, code int) {
	_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
}

// control applies window-change and signal requests to p.
func (c *conn) control(ctx context.Context, p *client.Process, reqs <-chan *ssh.Request) {
	for req := range reqs {
		ok := false
		switch req.Type {
		case "window-change":
			var w struct{ Cols, Rows, Width, Height uint32 }
			if ssh.Unmarshal(req.Payload, &w) == nil {
				ok = p.Resize(ctx, client.PTYSize{Cols: clamp(w.Cols, 80), Rows: clamp(w.Rows, 24)}) == nil
			}
		case "signal":
			var s struct{ Signal string }
			if ssh.Unmarshal(req.Payload, &s) == nil {
				if sig, known := signals[s.Signal]; known {
					ok = p.Signal(ctx, sig) == nil
				}
			}
		}
		if req.WantReply {
			_ = req.Reply(ok, nil)
		}
	}
}

var signals = map[string]syscall.Signal{"INT": syscall.SIGINT, "TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL,
	"HUP": syscall.SIGHUP, "QUIT": syscall.SIGQUIT, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2}

func sshSignalName(sig syscall.Signal) string {
	for name, s := range signals {
		if s == sig {
			return name
		}
	}
	return "KILL"
}

// sftp serves the sftp subsystem over the sandbox's filesystem API, in
// the template user's home directory.
func (c *conn) sftp(ctx context.Context, ch ssh.Channel) {
	e := c.t.Envd()
	fsys := &agentFS{ctx: ctx, c: c, e: e, max: c.s.cfg.MaxFileBytes, dir: c.s.cfg.SpoolDir}
	var opts []sftp.RequestServerOption
	if home, err := e.Stat(ctx, "."); err == nil && home.Type == client.TypeDir && home.Path != "" {
		opts = append(opts, sftp.WithStartDirectory(home.Path))
	}
	// The server's Close would close ch before its exit status is sent;
	// the channel ends when the client closes it or the connection ends.
	srv := sftp.NewRequestServer(keepOpen{ch}, sftp.Handlers{FileGet: fsys, FilePut: fsys, FileCmd: fsys, FileList: fsys}, opts...)
	if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
		c.s.log.Debug("sftp session", "sandbox_id", c.id, "err", err)
	}
	_ = srv.Close()
	sendExit(ch, 0)
}

// keepOpen is a channel whose Close is left to its owner.
type keepOpen struct{ ssh.Channel }

func (keepOpen) Close() error { return nil }
