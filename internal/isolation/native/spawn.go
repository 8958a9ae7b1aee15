package native

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation/native/nsinit"
)

// SpawnerArg is the argument with which the fence binary runs as the
// backend's spawner (Spawner).
const SpawnerArg = "__fence-spawner"

// Why a spawner. A process cloned into a new user namespace cannot share
// its parent's memory until it executes (the parent must write its id
// maps meanwhile), so the kernel copies the cloning process's whole
// address space: its page tables at the clone, then a copy-on-write fault
// for every page the parent writes until the child executes, and a
// write-protect fault for every page after. For a daemon holding thousands
// of sandboxes (hundreds of MiB) that cost grows with every sandbox alive,
// and it was what made creates slow down as sandboxes accumulated.
//
// So sandboxes are cloned by a small process of the fence binary started
// once per backend, whose memory does not grow: the spawner. It is
// started with a plain fork and exec (no new namespace), which shares the
// daemon's memory until it executes and copies nothing. It clones and
// executes each sandbox's init and hands the daemon a pidfd of it: the
// daemon signals the init and learns of its exit through that pidfd
// alone, as it did for its own children (a pidfd names one process, never
// a pid reused after it). The spawner reaps its children as they exit.
// (CLONE_PARENT, which would make the init the
// daemon's child, is refused by clone3 with an exit signal, and clone3 is
// what a clone into a cgroup or a time namespace needs.)

// spawnRequest is what the daemon asks the spawner to start. The
// descriptors travel beside it: Files of them become the child's 0..Files-1
// (in order), and when CgroupFD is set one more is the cgroup the child is
// cloned into.
type spawnRequest struct {
	Path        string                 `json:"path"`
	Args        []string               `json:"args"`
	Env         []string               `json:"env"`
	Dir         string                 `json:"dir"`
	Files       int                    `json:"files"`
	CgroupFD    bool                   `json:"cgroupFD,omitempty"`
	Cloneflags  uintptr                `json:"cloneflags"`
	UidMappings []syscall.SysProcIDMap `json:"uidMappings,omitempty"`
	GidMappings []syscall.SysProcIDMap `json:"gidMappings,omitempty"`
	Setsid      bool                   `json:"setsid,omitempty"`
}

// spawnReply is the spawner's answer: the child's pid (its pidfd travels
// beside it), or why it was not started.
type spawnReply struct {
	Pid int    `json:"pid,omitempty"`
	Err string `json:"err,omitempty"`
}

// spawnFD is the spawner's end of its socket.
const spawnFD = 3

// maxSpawnMsg bounds one request (the config of a sandbox's init is small).
const maxSpawnMsg = 64 << 10

// Spawner is the SpawnerArg role: it serves spawn requests on descriptor 3
// (a SOCK_SEQPACKET socket from the daemon), one at a time, and exits when
// the daemon closes its end (or dies). It never returns.
func Spawner() {
	// Defence in depth for a process that runs as the host's root; the
	// inits bound themselves (their user namespace starts them with a
	// full bounding set).
	_ = nsinit.BoundSpawner()
	// Children are reaped as they exit; the daemon watches them through
	// their pidfds. (Not by ignoring SIGCHLD: an ignored signal stays
	// ignored across execve, and the sandbox's processes must start with
	// the default disposition.)
	go reapChildren()
	buf := make([]byte, maxSpawnMsg)
	oob := make([]byte, unix.CmsgSpace(16*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(spawnFD, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			os.Exit(0) // the daemon is gone
		}
		var fds []int
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if rights, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, rights...)
				}
			}
		}
		pid, pidfd, err := spawnOne(buf[:n], fds)
		for _, fd := range fds {
			unix.Close(fd)
		}
		reply := spawnReply{Pid: pid}
		var rights []byte
		if err != nil {
			reply.Err = err.Error()
		} else {
			rights = unix.UnixRights(pidfd)
		}
		out, _ := json.Marshal(reply)
		err = unix.Sendmsg(spawnFD, out, rights, nil, 0)
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		if err != nil {
			os.Exit(0)
		}
	}
}

// reapChildren waits for every child that exits.
func reapChildren() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	for range sigs {
		for {
			pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil)
			if pid <= 0 && err != unix.EINTR {
				break
			}
		}
	}
}

// spawnOne clones and executes the child a request describes and returns
// its pid and a pidfd of it.
func spawnOne(msg []byte, fds []int) (pid, pidfd int, err error) {
	pidfd = -1
	var req spawnRequest
	if err := json.Unmarshal(msg, &req); err != nil {
		return 0, -1, fmt.Errorf("bad spawn request: %w", err)
	}
	want := req.Files
	if req.CgroupFD {
		want++
	}
	if req.Files < 0 || len(fds) != want {
		return 0, -1, fmt.Errorf("spawn request with %d descriptors, %d expected", len(fds), want)
	}
	files := make([]uintptr, req.Files)
	for i := range files {
		files[i] = uintptr(fds[i])
	}
	sys := &syscall.SysProcAttr{
		Cloneflags:                 req.Cloneflags,
		PidFD:                      &pidfd,
		UidMappings:                req.UidMappings,
		GidMappings:                req.GidMappings,
		GidMappingsEnableSetgroups: true,
		Setsid:                     req.Setsid,
	}
	if req.UidMappings != nil {
		// Become the namespace's root. Without this the child keeps host
		// uid 0, unmapped inside, and has no capabilities there.
		sys.Credential = &syscall.Credential{Uid: 0, Gid: 0}
	}
	if req.CgroupFD {
		sys.UseCgroupFD = true
		sys.CgroupFD = fds[req.Files]
	}
	pid, err = syscall.ForkExec(req.Path, req.Args, &syscall.ProcAttr{
		Dir: req.Dir, Env: req.Env, Files: files, Sys: sys,
	})
	if err != nil {
		return 0, -1, err
	}
	return pid, pidfd, nil
}

// spawner is the daemon's side: the running spawner process and its
// socket. Requests are serialised (a clone of the small spawner takes
// well under a millisecond). A spawner that died is started again on the
// next request.
type spawner struct {
	exe string

	mu   sync.Mutex
	conn *os.File      // the daemon's end; nil when no spawner runs
	proc *exec.Cmd     // the spawner
	dead chan struct{} // closed when proc has exited
	// place, when set (setPlace), moves a spawner process into the cgroup
	// its children are to be born in; placed reports whether the running
	// one is there.
	place  func(pid int) error
	placed bool
	// closed is set by close: no spawner is started after it.
	closed bool
}

// start runs a new spawner.
//
// +checklocks:sp.mu
func (sp *spawner) startLocked() error {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("creating spawner socket: %w", err)
	}
	mine := os.NewFile(uintptr(pair[0]), "spawner")
	theirs := os.NewFile(uintptr(pair[1]), "spawner-child")
	defer theirs.Close()
	cmd := &exec.Cmd{
		Path:       sp.exe,
		Args:       []string{"fence", SpawnerArg},
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Dir:        "/",
		ExtraFiles: []*os.File{theirs}, // fd 3
		Stderr:     os.Stderr,
	}
	if err := cmd.Start(); err != nil {
		mine.Close()
		return fmt.Errorf("starting the sandbox spawner: %w", err)
	}
	dead := make(chan struct{})
	go func() { _ = cmd.Wait(); close(dead) }()
	sp.conn, sp.proc, sp.dead = mine, cmd, dead
	sp.placed = sp.place != nil && sp.place(cmd.Process.Pid) == nil
	return nil
}

// setPlace makes place move every spawner, the running one first, into
// the cgroup its children are to be born in (see Backend.startReady). A
// spawner it fails for stays where it is; spawned.placed tells.
func (sp *spawner) setPlace(place func(pid int) error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.place = place
	if sp.conn != nil {
		sp.placed = place(sp.proc.Process.Pid) == nil
	}
}

// stopLocked closes the spawner's socket (it exits on EOF).
//
// +checklocks:sp.mu
func (sp *spawner) stopLocked() {
	if sp.conn != nil {
		sp.conn.Close()
		sp.conn = nil
	}
}

// warm starts the spawner ahead of the first request.
func (sp *spawner) warm() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.conn == nil && !sp.closed {
		_ = sp.startLocked() // a failure shows at the first request
	}
}

// close stops the spawner and waits for it to exit.
func (sp *spawner) close() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.closed = true
	sp.stopLocked()
	if sp.dead != nil {
		<-sp.dead
		sp.dead = nil
	}
}

// spawn starts req's child with files as its descriptors 0..len-1 (and,
// if cgroup >= 0, cloned into that cgroup) and returns it.
func (sp *spawner) spawn(req spawnRequest, files []*os.File, cgroup int) (*spawned, error) {
	req.Files = len(files)
	req.CgroupFD = cgroup >= 0
	fds := make([]int, 0, len(files)+1)
	for _, f := range files {
		fds = append(fds, int(f.Fd()))
	}
	if cgroup >= 0 {
		fds = append(fds, cgroup)
	}
	msg, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.closed {
		return nil, errSpawnerClosed
	}
	var p *spawned
	// A spawner that died since the last request gets one restart.
	for attempt := 0; ; attempt++ {
		if sp.conn == nil {
			if err := sp.startLocked(); err != nil {
				return nil, err
			}
		}
		p, err = sp.exchangeLocked(msg, fds)
		if err == nil {
			p.placed = sp.placed && cgroup < 0
			break
		}
		if attempt == 1 || !errors.Is(err, errSpawnerGone) {
			break
		}
		sp.stopLocked()
	}
	return p, err
}

var errSpawnerGone = errors.New("sandbox spawner is gone")

var errSpawnerClosed = errors.New("sandbox spawner: backend closed")

// +checklocks:sp.mu
func (sp *spawner) exchangeLocked(msg []byte, fds []int) (*spawned, error) {
	fd := int(sp.conn.Fd())
	if err := unix.Sendmsg(fd, msg, unix.UnixRights(fds...), nil, 0); err != nil {
		return nil, fmt.Errorf("%w: %v", errSpawnerGone, err)
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%w: %v", errSpawnerGone, err)
		}
		var pidfds []int
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if rights, err := unix.ParseUnixRights(&m); err == nil {
					pidfds = append(pidfds, rights...)
				}
			}
		}
		var r spawnReply
		if err := json.Unmarshal(buf[:n], &r); err != nil || r.Err != "" || len(pidfds) != 1 {
			for _, fd := range pidfds {
				unix.Close(fd)
			}
			switch {
			case err != nil:
				return nil, fmt.Errorf("bad reply from the sandbox spawner: %w", err)
			case r.Err != "":
				return nil, errors.New(r.Err)
			default:
				return nil, fmt.Errorf("the sandbox spawner sent %d pidfds", len(pidfds))
			}
		}
		return &spawned{Pid: r.Pid, fd: pidfds[0]}, nil
	}
}

// spawned is a process the spawner started, known by its pidfd: signals
// reach that process and no other, even once its pid is reused.
type spawned struct {
	Pid int
	fd  int
	// placed: born in the cgroup the spawner was placed in (setPlace).
	placed bool

	mu     sync.Mutex
	closed bool // fd closed: the process has exited and been waited for
}

// Signal sends sig to the process; os.ErrProcessDone once it has exited.
func (p *spawned) Signal(sig unix.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return os.ErrProcessDone
	}
	err := unix.PidfdSendSignal(p.fd, sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// Kill sends SIGKILL.
func (p *spawned) Kill() error { return p.Signal(unix.SIGKILL) }

// Wait returns once the process has exited, parked on the runtime's
// network poller (no OS thread held per sandbox), and closes its pidfd.
func (p *spawned) Wait() {
	fd, err := unix.Dup(p.fd)
	if err == nil {
		unix.CloseOnExec(fd)
		if err = unix.SetNonblock(fd, true); err == nil {
			f := os.NewFile(uintptr(fd), "pidfd") // nonblocking: registered with the poller
			if rc, err := f.SyscallConn(); err == nil {
				_ = rc.Read(func(fd uintptr) bool {
					n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
					return n > 0 || (err != nil && err != unix.EINTR)
				})
			}
			f.Close()
		} else {
			unix.Close(fd)
		}
	}
	if err != nil {
		// No poller registration: block a thread in poll(2) instead.
		for {
			if _, err := unix.Poll([]unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}, -1); err != unix.EINTR {
				break
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		unix.Close(p.fd)
	}
}
