package process

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/internal/agent/users"
)

// start validates msg and starts the process as u, returning it with a
// subscriber that sees all of its output.
func (s *Service) start(u *users.User, msg *pb.StartRequest) (*proc, *subscriber, error) {
	cfg := msg.GetProcess()
	cmd, err := s.resolve(u, cfg)
	if err != nil {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	io, err := openStdio(u, msg)
	if err != nil {
		return nil, nil, connect.NewError(connect.CodeInternal, err)
	}
	attr := s.procAttr(u, cmd, io)
	p := &proc{
		info:    &pb.ProcessInfo{Config: cfg, Tag: msg.Tag},
		stall:   s.opts.Stall,
		budget:  s.budget,
		onStall: s.dropStalled,
		reaper:  s.reaper,
		stop:    make(chan struct{}),
		master:  io.master,
		stdin:   io.stdinW,
		exited:  make(chan struct{}),
		done:    make(chan struct{}),
		subs:    make(map[*subscriber]struct{}),
	}
	sub := newSubscriber(s.budget)
	p.subs[sub] = struct{}{}

	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		io.closeChild()
		io.closeOurs()
		return nil, nil, connect.NewError(connect.CodeInternal, errors.New("agent is shutting down"))
	}
	pidfd := -1
	attr.Sys.PidFD = &pidfd
	s.waitForks()
	pid, err := s.reaper.start(func() (int, error) {
		return syscall.ForkExec(cmd.path, cmd.argv, attr)
	}, func(ws unix.WaitStatus) {
		p.status = ws
		close(p.exited)
	})
	io.closeChild()
	if err != nil {
		io.closeOurs()
		if cerr := cmd.explain(); cerr != nil {
			err = cerr
		} else {
			err = fmt.Errorf("starting %s: %w", cfg.GetCmd(), err)
		}
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	p.pid = pid
	p.pidfd = pidfdFile(pidfd)
	p.info.Pid = uint32(pid)
	s.mu.Lock()
	s.pruneLocked(time.Now())
	s.procs[pid] = p
	s.running++
	s.mu.Unlock()
	s.log.Debug("process started", "pid", pid, "cmd", cfg.GetCmd(), "user", u.Name)
	s.follow(p, io)
	return p, sub, nil
}

// command is a process's program, arguments, working directory and
// environment, resolved for its user.
type command struct {
	path string
	argv []string
	dir  string
	env  []string
	// pathChecked is set when path was stat'ed (a PATH lookup, the SDK
	// shell); else the child's execve is its only check.
	pathChecked bool
}

// The working directory and an absolute program are not stat'ed before
// a start: the child's chdir and execve check them anyway, and every exec
// would pay for the stats (about 6 µs each on a sandbox's overlay, with
// the seccomp filter's run). Only a start that failed checks them, for
// the error the checks give (explain).

// resolve checks cfg's command and resolves it and its working directory
// for u. The working directory, and an absolute program other than the
// SDK shell, are checked by the start itself (see explain).
func (s *Service) resolve(u *users.User, cfg *pb.ProcessConfig) (command, error) {
	if cfg.GetCmd() == "" {
		return command{}, errors.New("process.cmd is required")
	}
	dir := s.opts.Users.Workdir(u)
	if cfg.Cwd != nil && *cfg.Cwd != "" {
		dir = s.opts.Users.ResolvePath(*cfg.Cwd, u)
	}
	env := buildEnv(u, s.GlobalEnv(), cfg.GetEnvs())
	argv0 := cfg.GetCmd()
	if filepath.IsAbs(argv0) && argv0 != sdkShell {
		return command{path: argv0, argv: append([]string{argv0}, cfg.GetArgs()...), dir: dir, env: env}, nil
	}
	path, err := lookPath(argv0, envValue(env, "PATH"), dir)
	if err != nil && argv0 == sdkShell {
		// The SDKs run every command and PTY with /bin/bash; templates
		// without bash (minimal, busybox) get their POSIX shell instead.
		if p, serr := lookPath(fallbackShell, "", dir); serr == nil {
			path, argv0, err = p, fallbackShell, nil
		}
	}
	if err != nil {
		// A missing working directory is the error, as if checked first.
		if derr := checkDir(dir); derr != nil {
			return command{}, derr
		}
		return command{}, err
	}
	return command{path: path, argv: append([]string{argv0}, cfg.GetArgs()...), dir: dir, env: env, pathChecked: true}, nil
}

// explain returns the error the checks of c's working directory and
// program give, after c failed to start; nil if both pass.
func (c command) explain() error {
	if err := checkDir(c.dir); err != nil {
		return err
	}
	if c.pathChecked {
		return nil
	}
	if err := checkExec(c.path); err != nil {
		return fmt.Errorf("command %q: %w", c.argv[0], err)
	}
	return nil
}

// checkDir checks that dir is a directory.
func checkDir(dir string) error {
	if fi, err := os.Stat(dir); err != nil {
		return fmt.Errorf("cwd %q: %w", dir, err)
	} else if !fi.IsDir() {
		return fmt.Errorf("cwd %q is not a directory", dir)
	}
	return nil
}

// checkExec checks that p is a file with an execute bit.
func checkExec(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%s is a directory", p)
	}
	if fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s: %w", p, os.ErrPermission)
	}
	return nil
}

// stdio is a process's standard streams: the child's ends and the
// agent's.
type stdio struct {
	child    [3]int // the child's stdin, stdout, stderr
	closeAft []int  // raw descriptors closed in the parent after the fork
	slave    *os.File
	outputs  []*os.File // our read ends
	kinds    []int
	master   *os.File
	stdinW   *os.File
}

// closeChild closes the child's ends in the agent (after the fork).
func (io *stdio) closeChild() {
	for _, fd := range io.closeAft {
		unix.Close(fd)
	}
	if io.slave != nil {
		io.slave.Close()
	}
}

// closeOurs closes the agent's ends (when no process started).
func (io *stdio) closeOurs() {
	for _, f := range io.outputs {
		f.Close()
	}
	if io.master != nil {
		io.master.Close()
	}
	if io.stdinW != nil {
		io.stdinW.Close()
	}
}

// openStdio opens a process's standard streams as msg asks: a PTY, or
// pipes (stdin from /dev/null unless asked for). On error it has closed
// what it opened.
func openStdio(u *users.User, msg *pb.StartRequest) (*stdio, error) {
	io := &stdio{}
	var err error
	if msg.GetPty() != nil {
		err = io.openPTY(u, msg.GetPty().GetSize())
	} else {
		err = io.openPipes(msg.Stdin == nil || msg.GetStdin())
	}
	if err != nil {
		io.closeChild()
		io.closeOurs()
		return nil, err
	}
	return io, nil
}

// openPTY gives the child a PTY of size (80x24 where unset), owned by u.
func (io *stdio) openPTY(u *users.User, size *pb.PTY_Size) error {
	m, sl, err := openPTY()
	if err != nil {
		return err
	}
	io.master, io.slave = m, sl
	cols, rows := size.GetCols(), size.GetRows()
	if cols == 0 {
		cols = 80
	}
	if rows == 0 {
		rows = 24
	}
	if err := setSize(io.master, cols, rows); err != nil {
		return fmt.Errorf("sizing pty: %w", err)
	}
	_ = os.Chown(io.slave.Name(), int(u.UID), int(u.GID))
	fd := int(io.slave.Fd())
	io.child = [3]int{fd, fd, fd}
	io.outputs, io.kinds = []*os.File{io.master}, []int{3}
	return nil
}

// openPipes gives the child pipes for stdout and stderr, and for stdin
// when withStdin (else /dev/null).
func (io *stdio) openPipes(withStdin bool) error {
	if withStdin {
		w, r, err := childPipe(true, "stdin")
		if err != nil {
			return err
		}
		io.stdinW = w
		io.closeAft = append(io.closeAft, r)
		io.child[0] = r
	} else {
		null, err := devNull()
		if err != nil {
			return err
		}
		io.child[0] = null // the agent's own: not closed
	}
	for i := 1; i <= 2; i++ {
		r, w, err := childPipe(false, "output")
		if err != nil {
			return err
		}
		io.closeAft = append(io.closeAft, w)
		io.outputs, io.kinds = append(io.outputs, r), append(io.kinds, i)
		io.child[i] = w
	}
	return nil
}

// procAttr is how cmd starts as u with io: a session of its own, the
// PTY its controlling terminal if it has one.
func (s *Service) procAttr(u *users.User, cmd command, io *stdio) *syscall.ProcAttr {
	attr := &syscall.ProcAttr{
		Dir:   cmd.dir,
		Env:   cmd.env,
		Files: []uintptr{uintptr(io.child[0]), uintptr(io.child[1]), uintptr(io.child[2])},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	}
	if io.master != nil {
		attr.Sys.Setctty = true
		attr.Sys.Ctty = 0
	}
	if u.UID != s.euid || u.GID != s.egid {
		attr.Sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	return attr
}

// follow reads p's output and publishes its end; the process is
// forgotten the retention time after (by the first start or lookup
// after that).
func (s *Service) follow(p *proc, io *stdio) {
	var wg sync.WaitGroup
	for i, f := range io.outputs {
		wg.Add(1)
		go p.readOutput(f, i, io.kinds[i], io.master == nil, &wg)
	}
	go p.finish(outputsFor(io.master, io.outputs), &wg, s.opts.DrainGrace, func() {
		s.log.Debug("process ended", "pid", p.pid, "status", p.end.GetEnd().GetStatus())
		s.ended(p)
	})
}

// trimAfter is how long after the last process's end the agent's threads
// are trimmed, if no process has started since. Not at the end itself:
// while commands follow one another, the runtime starts a thread whenever
// the forking one is blocked long (a busy machine), and a trim at every
// end ended it again, so that each command paid a thread's start and end
// and the trim's own waits. The end's stream and the client's next
// requests run before the trim, not after it.
const trimAfter = time.Second

// ended counts p's end and starts its retention; once the last one
// running has ended, the agent's threads are trimmed to
// Options.IdleThreads trimAfter later, if it is still idle (one timer for
// the service, moved on by every such end).
func (s *Service) ended(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	s.finished = append(s.finished, finished{p, time.Now().Add(s.opts.Retention)})
	if s.running != 0 || s.opts.IdleThreads <= 0 {
		return
	}
	if s.trim == nil {
		s.trim = time.AfterFunc(trimAfter, s.trimIfIdle)
	} else {
		s.trim.Reset(trimAfter)
	}
}

// trimIfIdle trims the agent's threads if no process it started runs.
func (s *Service) trimIfIdle() {
	s.mu.Lock()
	idle := s.running == 0
	s.mu.Unlock()
	if idle {
		s.trims.Add(1)
		TrimThreads(s.opts.IdleThreads)
	}
}

// outputsFor returns the files finish may close to stop readers: the pipe
// read ends; a PTY master is closed by finish itself.
func outputsFor(master *os.File, outputs []*os.File) []*os.File {
	if master != nil {
		return []*os.File{master}
	}
	return outputs
}

// buildEnv layers the defaults, the sandbox env vars and the request's.
func buildEnv(u *users.User, global, request map[string]string) []string {
	vals := map[string]string{
		"PATH":    DefaultPath,
		"HOME":    u.Home,
		"USER":    u.Name,
		"LOGNAME": u.Name,
	}
	order := []string{"PATH", "HOME", "USER", "LOGNAME"}
	add := func(m map[string]string) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				continue
			}
			if _, ok := vals[k]; !ok {
				order = append(order, k)
			}
			vals[k] = strings.ReplaceAll(m[k], "\x00", "")
		}
	}
	add(global)
	add(request)
	env := make([]string, 0, len(order))
	for _, k := range order {
		env = append(env, k+"="+vals[k])
	}
	return env
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// lookPath finds cmd the way a shell would, using the child's PATH; a
// relative path with a slash is taken against dir.
func lookPath(cmd, pathEnv, dir string) (string, error) {
	check := checkExec
	if strings.Contains(cmd, "/") {
		p := cmd
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := check(p); err != nil {
			return "", fmt.Errorf("command %q: %w", cmd, err)
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, cmd)
		if check(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q: executable file not found in $PATH", cmd)
}
