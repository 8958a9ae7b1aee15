// Package spawnrole is the native backend's spawner: a small process of
// fence's, started once per backend as the host's root, that clones and
// executes every sandbox's init and hands the daemon a pidfd of it.
//
// Why a spawner. A process cloned into a new user namespace cannot share
// its parent's memory until it executes (the parent must write its id
// maps meanwhile), so the kernel copies the cloning process's whole
// address space: its page tables at the clone, then a copy-on-write fault
// for every page the parent writes until the child executes, and a
// write-protect fault for every page after. For a daemon holding thousands
// of sandboxes (hundreds of MiB) that cost grows with every sandbox alive,
// and it was what made creates slow down as sandboxes accumulated. The
// spawner's memory does not grow, and is small: it runs from the
// in-sandbox binary when the fence binary carries one (package insandbox),
// whose start leaves about a third of the fence binary's memory behind
// for every clone to copy.
//
// The spawner is started with a plain fork and exec (no new namespace),
// which shares the daemon's memory until it executes and copies nothing.
// The daemon signals each init and learns of its exit through its pidfd
// alone, as it did for its own children (a pidfd names one process, never
// a pid reused after it). The spawner reaps each child as it exits, through
// a pidfd of its own: a wait for any child scans every child alive, so the
// spawner of thousands of sandboxes would pay for all of them at each exit.
// (CLONE_PARENT, which would make the init the daemon's child, is refused
// by clone3 with an exit signal, and clone3 is what a clone into a cgroup
// or a time namespace needs.)
//
// # Guarantees
//
//   - Serve starts exactly what a Request describes, with the
//     descriptors sent beside it and nothing else open in the child, and
//     answers each Request with the child's pid and a pidfd, or why not.
//   - The spawner holds in its bounding set only what an init keeps or
//     uses for its setup (nsinit.BoundSpawner), and exits when the
//     daemon's end of its socket closes.
package spawnrole

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
	"github.com/fencesandbox/fence/internal/sysmon"
)

// Arg is the argument with which the fence binary, or the in-sandbox
// binary, runs as the spawner (Serve).
const Arg = "__fence-spawner"

// Request is what the daemon asks the spawner to start. The descriptors
// travel beside it: Files of them become the child's 0..Files-1 (in
// order), and when CgroupFD is set one more is the cgroup the child is
// cloned into.
type Request struct {
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

// Reply is the spawner's answer: the child's pid (its pidfd travels
// beside it), or why it was not started.
type Reply struct {
	Pid int    `json:"pid,omitempty"`
	Err string `json:"err,omitempty"`
}

// FD is the spawner's end of its socket.
const FD = 3

// maxMsg bounds one request (the config of a sandbox's init is small).
const maxMsg = 64 << 10

// Serve is the Arg role: it serves spawn requests on descriptor FD (a
// SOCK_SEQPACKET socket from the daemon), one at a time, and exits when
// the daemon closes its end (or dies). It never returns.
func Serve() {
	// Defence in depth for a process that runs as the host's root; the
	// inits bound themselves (their user namespace starts them with a
	// full bounding set).
	_ = nsinit.BoundSpawner()
	// Children are reaped as they exit; the daemon watches them through
	// their pidfds. (Not by ignoring SIGCHLD: an ignored signal stays
	// ignored across execve, and the sandbox's processes must start with
	// the default disposition.)
	reap, err := newReaper()
	if err != nil {
		fmt.Fprintf(os.Stderr, "fence spawner: %v\n", err)
		os.Exit(1)
	}
	go reap.run()
	// Its runtime's monitor polls less while it waits (package sysmon).
	go func() { _ = sysmon.Relax(context.Background(), "/proc", sysmon.Default, 0) }()
	buf := make([]byte, maxMsg)
	oob := make([]byte, unix.CmsgSpace(16*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(FD, buf, oob, unix.MSG_CMSG_CLOEXEC)
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
		reply := Reply{Pid: pid}
		var rights []byte
		if err != nil {
			reply.Err = err.Error()
		} else {
			rights = unix.UnixRights(pidfd)
		}
		out, _ := json.Marshal(reply)
		err = unix.Sendmsg(FD, out, rights, nil, 0)
		if pidfd >= 0 {
			reap.add(pidfd)
		}
		if err != nil {
			os.Exit(0)
		}
	}
}

// reaper reaps the spawner's children, each when its pidfd reports its
// exit: one wait for that child alone, whatever the number alive.
type reaper struct {
	epfd int
}

func newReaper() (*reaper, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating the reaper's epoll: %w", err)
	}
	return &reaper{epfd: epfd}, nil
}

// add takes pidfd (the spawner's own descriptor of a child) and reaps the
// child once it has exited, then closes pidfd. A child that has exited
// already is reaped at once.
func (r *reaper) add(pidfd int) {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(pidfd)}
	if err := unix.EpollCtl(r.epfd, unix.EPOLL_CTL_ADD, pidfd, &ev); err != nil {
		// Out of memory for the watch: wait on a thread of its own.
		go func() {
			for waitPidfd(pidfd, 0) == unix.EINTR {
			}
			unix.Close(pidfd)
		}()
	}
}

// run reaps children as they exit. It never returns.
func (r *reaper) run() {
	evs := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(r.epfd, evs, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			// Children would be left unreaped: the daemon starts a new
			// spawner at its next create.
			fmt.Fprintf(os.Stderr, "fence spawner: waiting for children: %v\n", err)
			os.Exit(1)
		}
		for _, ev := range evs[:n] {
			fd := int(ev.Fd)
			if err := waitPidfd(fd, unix.WNOHANG); err == unix.EAGAIN || err == unix.EINTR {
				continue // not a zombie yet: it is reported again
			}
			unix.EpollCtl(r.epfd, unix.EPOLL_CTL_DEL, fd, nil)
			unix.Close(fd)
		}
	}
}

// waitPidfd reaps the child pidfd names, waiting for its exit unless
// flags has WNOHANG; EAGAIN when it has not exited.
func waitPidfd(pidfd, flags int) error {
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|flags, nil); err != nil {
		return err
	}
	if info.Signo == 0 { // WNOHANG and still running
		return unix.EAGAIN
	}
	return nil
}

// spawnOne clones and executes the child a request describes and returns
// its pid and a pidfd of it.
func spawnOne(msg []byte, fds []int) (pid, pidfd int, err error) {
	pidfd = -1
	var req Request
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
	// The init starts with the kernel's default timer slack, whichever
	// this thread has (package sysmon).
	sysmon.Fork(func() {
		pid, err = syscall.ForkExec(req.Path, req.Args, &syscall.ProcAttr{
			Dir: req.Dir, Env: req.Env, Files: files, Sys: sys,
		})
	})
	if err != nil {
		return 0, -1, err
	}
	return pid, pidfd, nil
}
