package process

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/agent/users"
)

// SpawnSpec is a process started outside the Connect API (the agent's
// sudo service): the caller hands over its stdio descriptors.
type SpawnSpec struct {
	User  *users.User
	Argv  []string          // argv[0] is looked up in PATH
	Env   map[string]string // on top of the user's defaults and the global env
	Dir   string            // working directory; "" = the user's workdir
	Stdio [3]*os.File
}

// Spawn starts spec through the agent's reaper (so nothing else steals its
// exit status) and returns its pid and a channel that yields its wait
// status once it exits.
func (s *Service) Spawn(spec SpawnSpec) (int, <-chan unix.WaitStatus, error) {
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return 0, nil, errors.New("no command")
	}
	u := spec.User
	dir := spec.Dir
	if dir == "" {
		dir = s.opts.Users.Workdir(u)
	}
	env := buildEnv(u, s.GlobalEnv(), spec.Env)
	path, err := lookPath(spec.Argv[0], envValue(env, "PATH"), dir)
	if err != nil {
		return 0, nil, err
	}
	attr := &syscall.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: []uintptr{spec.Stdio[0].Fd(), spec.Stdio[1].Fd(), spec.Stdio[2].Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	if u.UID != s.euid || u.GID != s.egid {
		attr.Sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return 0, nil, errors.New("agent is shutting down")
	}
	exited := make(chan unix.WaitStatus, 1)
	pidfd := -1
	attr.Sys.PidFD = &pidfd
	s.waitForks()
	pid, err := s.reaper.start(func() (int, error) {
		return syscall.ForkExec(path, spec.Argv, attr)
	}, func(ws unix.WaitStatus) { exited <- ws })
	if err != nil {
		return 0, nil, fmt.Errorf("starting %s: %w", spec.Argv[0], err)
	}
	if f := pidfdFile(pidfd); f != nil {
		go func() {
			s.reaper.awaitExit(pid, f)
			f.Close()
		}()
	}
	return pid, exited, nil
}
