package sudo

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/agent/process"
	"github.com/fencesandbox/fence/internal/agent/users"
)

// Server runs sudo requests through the agent's process service.
type Server struct {
	Procs *process.Service
	Log   *slog.Logger
	// Root is the filesystem root the sudo configuration is read from;
	// "" means "/" (tests point it elsewhere).
	Root string
}

// Listen creates the socket at path (its directory too), open to every
// user: who may do what is decided per connection from its credentials.
// A stream socket: gVisor gives a SOCK_SEQPACKET connection the listener's
// credentials as its peer's (SO_PEERCRED would name root for every
// caller), a SOCK_STREAM one its caller's, as Linux does for both.
func Listen(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating sudo socket directory: %w", err)
	}
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening for sudo: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("opening the sudo socket to users: %w", err)
	}
	return ln, nil
}

// Serve answers connections on ln until ctx is done.
func (s *Server) Serve(ctx context.Context, ln *net.UnixListener) {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		go s.handle(c)
	}
}

// handle serves one client on c: its request and stdio, who it is, the
// command it may run, and then the command's signals and end.
func (s *Server) handle(c *net.UnixConn) {
	defer c.Close()
	cred, err := peerCred(c)
	if err != nil {
		writeError(c, "sudo: cannot tell who is asking")
		return
	}
	buf := make([]byte, maxRequest+4)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return
	}
	stdio, err := receiveFiles(oob[:oobn])
	if err != nil {
		writeError(c, "sudo: "+err.Error())
		return
	}
	defer func() {
		for _, f := range stdio {
			if f != nil {
				f.Close()
			}
		}
	}()
	// The stream may hold the request in pieces (its length first) and,
	// after it, the client's first signals.
	raw, extra, err := readRequest(c, buf, n)
	if err != nil {
		writeError(c, "sudo: "+err.Error())
		return
	}
	req, err := decodeRequest(raw)
	if err != nil {
		writeError(c, "sudo: "+err.Error())
		return
	}
	caller, tu, err := s.authorize(cred, req)
	if err != nil {
		writeError(c, err.Error())
		return
	}
	argv, dir := command(req, tu)
	env := commandEnv(caller, cred, argv, req.Env)
	pid, exited, err := s.Procs.Spawn(process.SpawnSpec{User: tu, Argv: argv, Env: env, Dir: dir, Stdio: stdio})
	if err != nil {
		writeError(c, "sudo: "+err.Error())
		return
	}
	for i, f := range stdio {
		f.Close()
		stdio[i] = nil
	}
	s.Log.Info("sudo", "caller", caller.Name, "user", tu.Name, "argv", argv)
	relay(c, extra, pid, exited)
}

// authorize looks up the caller (the peer's uid) and the user the
// request runs as (root by default); the error, for the client, says who
// is missing or that the caller may not use sudo.
func (s *Server) authorize(cred *unix.Ucred, req *request) (caller, target *users.User, err error) {
	caller, err = users.LookupID(cred.Uid)
	if err != nil {
		return nil, nil, fmt.Errorf("sudo: you do not exist in the passwd database (uid %d)", cred.Uid)
	}
	if !s.allowed(caller) {
		return nil, nil, fmt.Errorf("sudo: %s is not in the sudoers file", caller.Name)
	}
	name := req.User
	if name == "" {
		name = "root"
	}
	target, err = users.Lookup(name)
	if err != nil {
		return nil, nil, fmt.Errorf("sudo: unknown user %s", name)
	}
	return caller, target, nil
}

// command is the argv and directory a request runs as user tu: its own,
// or with -s or -i through tu's shell (-i: a login shell in tu's home).
func command(req *request, tu *users.User) (argv []string, dir string) {
	argv, dir = req.Argv, req.Dir
	if req.Login || req.Shell {
		sh := tu.Shell
		if sh == "" {
			sh = "/bin/sh"
		}
		shArgv := []string{sh}
		if req.Login {
			shArgv = append(shArgv, "-l")
			dir = tu.Home
		}
		if len(argv) > 0 {
			shArgv = append(shArgv, "-c", strings.Join(argv, " "))
		}
		argv = shArgv
	}
	return argv, dir
}

// commandEnv is the environment of the command: sudo's SUDO_* variables,
// then the client's, but for the loader's and those naming the user and
// its paths (LD_*, PATH, HOME, USER, LOGNAME).
func commandEnv(caller *users.User, cred *unix.Ucred, argv []string, reqEnv map[string]string) map[string]string {
	env := map[string]string{
		"SUDO_USER": caller.Name, "SUDO_UID": fmt.Sprint(cred.Uid), "SUDO_GID": fmt.Sprint(cred.Gid),
		"SUDO_COMMAND": strings.Join(argv, " "),
	}
	for k, v := range reqEnv {
		if strings.HasPrefix(k, "LD_") || k == "PATH" || k == "HOME" || k == "USER" || k == "LOGNAME" {
			continue // as sudo's env_reset keeps them the target's
		}
		if _, set := env[k]; !set {
			env[k] = v
		}
	}
	return env
}

// relay sends the client's signals (those already read, in extra, then
// the rest of c) to the command's process group pid until the command
// exits, and then tells the client how it ended; a client that goes away
// takes the command with it.
func relay(c *net.UnixConn, extra []byte, pid int, exited <-chan unix.WaitStatus) {
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		msgs := io.MultiReader(bytes.NewReader(extra), c)
		for {
			kind, v, err := readMsg(msgs)
			if err != nil {
				return
			}
			if kind == msgSignal && v > 0 && v < 65 {
				unix.Kill(-pid, unix.Signal(v))
			}
		}
	}()
	select {
	case ws := <-exited:
		if ws.Signaled() {
			writeMsg(c, msgKilled, int32(ws.Signal()))
		} else {
			writeMsg(c, msgExit, int32(ws.ExitStatus()))
		}
	case <-gone:
		unix.Kill(-pid, unix.SIGKILL)
		<-exited
	}
}

// allowed reports whether u may use sudo: root, members of the sudo group,
// and users with a file of their name in /etc/sudoers.d.
func (s *Server) allowed(u *users.User) bool {
	if u.UID == 0 {
		return true
	}
	root := s.Root
	if root == "" {
		root = "/"
	}
	if st, err := os.Stat(filepath.Join(root, "etc/sudoers.d", u.Name)); err == nil && st.Mode().IsRegular() {
		return true
	}
	if g, err := users.LookupGroup("sudo"); err == nil && slices.Contains(u.Groups, g) {
		return true
	}
	return false
}

// readRequest returns the length-prefixed request that starts buf, of
// which n bytes have been read from c, reading the rest from c, and the
// bytes read past it.
func readRequest(c io.Reader, buf []byte, n int) (req, extra []byte, err error) {
	if n < 4 {
		k, err := io.ReadAtLeast(c, buf[n:], 4-n)
		if err != nil {
			return nil, nil, fmt.Errorf("short request: %w", err)
		}
		n += k
	}
	size := 4 + int64(binary.BigEndian.Uint32(buf))
	if size > int64(len(buf)) {
		return nil, nil, fmt.Errorf("bad request length %d", size-4)
	}
	if int64(n) < size {
		if _, err := io.ReadFull(c, buf[n:size]); err != nil {
			return nil, nil, fmt.Errorf("short request: %w", err)
		}
		n = int(size)
	}
	return buf[:size], buf[size:n], nil
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	err = raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil {
		return nil, err
	}
	return cred, cerr
}

func receiveFiles(oob []byte) ([3]*os.File, error) {
	var files [3]*os.File
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) != 1 {
		return files, fmt.Errorf("want the caller's stdin, stdout and stderr")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 3 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return files, fmt.Errorf("want the caller's stdin, stdout and stderr")
	}
	for i, fd := range fds {
		unix.CloseOnExec(fd)
		files[i] = os.NewFile(uintptr(fd), fmt.Sprintf("stdio%d", i))
	}
	return files, nil
}
