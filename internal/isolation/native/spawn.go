package native

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/insandbox/spawnrole"
)

// spawner is the daemon's side of the spawner (package spawnrole): the
// running spawner process and its socket. Requests are serialised (a clone of the small spawner takes
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
		Path: sp.exe,
		Args: []string{"fence", spawnrole.Arg},
		// One P: the spawner serves one request at a time, and while its
		// only P waits in a system call (a clone, the child's id maps, the
		// wait for its exec) the runtime's sysmon takes the P and sleeps,
		// where with a second P idle it would poll every 20 µs throughout
		// (about 40 context switches and 1–2 ms of CPU less per init).
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GOMAXPROCS=1"},
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
func (sp *spawner) spawn(req spawnrole.Request, files []*os.File, cgroup int) (*spawned, error) {
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
		var r spawnrole.Reply
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
		return newSpawned(r.Pid, pidfds[0]), nil
	}
}

// spawned is a process the spawner started, known by its pidfd: signals
// reach that process and no other, even once its pid is reused. The pidfd
// is the one descriptor the daemon holds for the process: nonblocking and
// registered with the runtime's network poller, it is both what Wait
// parks on and what Signal sends through.
type spawned struct {
	Pid int
	f   *os.File // the pidfd; closed by Wait once the process has exited
	// placed: born in the cgroup the spawner was placed in (setPlace).
	placed bool
}

// newSpawned takes the pidfd fd of process pid.
func newSpawned(pid, fd int) *spawned {
	// Nonblocking, os.NewFile registers it with the poller; should that
	// fail, Wait blocks a thread in poll(2) instead.
	_ = unix.SetNonblock(fd, true)
	return &spawned{Pid: pid, f: os.NewFile(uintptr(fd), "pidfd")}
}

// Signal sends sig to the process; os.ErrProcessDone once it has exited.
func (p *spawned) Signal(sig unix.Signal) error {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return os.ErrProcessDone
	}
	var serr error
	// Control holds the pidfd open while it runs: Wait's Close never
	// lets the number be reused under a signal.
	if err := rc.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), sig, nil, 0) }); err != nil {
		return os.ErrProcessDone // closed: exited and waited for
	}
	if errors.Is(serr, unix.ESRCH) {
		return os.ErrProcessDone
	}
	return serr
}

// Kill sends SIGKILL.
func (p *spawned) Kill() error { return p.Signal(unix.SIGKILL) }

// Wait returns once the process has exited, parked on the runtime's
// network poller (no OS thread held per sandbox), and closes its pidfd.
func (p *spawned) Wait() {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return
	}
	exited := func(fd uintptr, timeout int) bool {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, timeout)
		return n > 0 || (err != nil && err != unix.EINTR)
	}
	if err := rc.Read(func(fd uintptr) bool { return exited(fd, 0) }); err != nil {
		// Not in the poller (or closed by an earlier Wait): block a
		// thread in poll(2) instead.
		_ = rc.Control(func(fd uintptr) {
			for !exited(fd, -1) {
			}
		})
	}
	p.f.Close()
}
