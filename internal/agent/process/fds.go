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

// outputPipe returns a pipe whose read end is the agent's (non-blocking,
// in the poller) and whose write end is a blocking raw descriptor for a
// child.
func outputPipe() (r *os.File, w int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, -1, fmt.Errorf("creating output pipe: %w", err)
	}
	// O_NONBLOCK is per open file: clearing it on the write end leaves
	// the read end non-blocking.
	if err := unix.SetNonblock(p[1], false); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, -1, fmt.Errorf("creating output pipe: %w", err)
	}
	return os.NewFile(uintptr(p[0]), "|0"), p[1], nil
}

// inputPipe returns a pipe whose write end is the agent's (non-blocking,
// in the poller, so writes can time out) and whose read end is a blocking
// raw descriptor for a child.
func inputPipe() (r int, w *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return -1, nil, fmt.Errorf("creating stdin pipe: %w", err)
	}
	if err := unix.SetNonblock(p[0], false); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return -1, nil, fmt.Errorf("creating stdin pipe: %w", err)
	}
	return p[0], os.NewFile(uintptr(p[1]), "|1"), nil
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
