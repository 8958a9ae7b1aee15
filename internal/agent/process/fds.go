package process

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// The descriptors of a child are made with as few system calls as the
// agent can: every exec pays for them, and inside a sandbox each system
// call also runs the seccomp filter. The ends a child gets are raw
// descriptors that never enter Go's poller (an *os.File end would be made
// non-blocking and registered, then made blocking again for the child and
// unregistered at close); only the agent's own ends are pollable files.
// All of them are close-on-exec: the child gets its three by dup3.

// childPipe returns a pipe between the agent and a child: the child's end
// (the read end for its stdin, else the write end) is a blocking raw
// descriptor; the agent's is non-blocking and in the poller, so that its
// reads and writes can time out. what names the pipe in errors.
func childPipe(childReads bool, what string) (agent *os.File, child int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, -1, fmt.Errorf("creating %s pipe: %w", what, err)
	}
	ours, theirs, name := p[0], p[1], "|0"
	if childReads {
		ours, theirs, name = p[1], p[0], "|1"
	}
	// O_NONBLOCK is per open file: clearing it on the child's end leaves
	// the agent's non-blocking. A new pipe's end has no other status flag
	// (F_SETFL ignores the access mode), so one F_SETFL clears it, without
	// the F_GETFL that unix.SetNonblock makes first.
	if _, err := unix.FcntlInt(uintptr(theirs), unix.F_SETFL, 0); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, -1, fmt.Errorf("creating %s pipe: %w", what, err)
	}
	return os.NewFile(uintptr(ours), name), theirs, nil
}

var (
	devNullMu sync.Mutex
	devNullFD = -1
)

// devNull returns a read-only descriptor of /dev/null that the agent
// keeps open (close-on-exec) and hands to every child without stdin:
// reads of /dev/null have no state one child could share with another. A
// failed open is tried again at the next call.
func devNull() (int, error) {
	devNullMu.Lock()
	defer devNullMu.Unlock()
	if devNullFD >= 0 {
		return devNullFD, nil
	}
	fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return -1, fmt.Errorf("opening %s: %w", os.DevNull, err)
	}
	devNullFD = fd
	return fd, nil
}
