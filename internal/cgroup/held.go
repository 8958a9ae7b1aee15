package cgroup

import (
	"sync"

	"golang.org/x/sys/unix"
)

// HeldCPU keeps a group's CPU time control file (cpuacct.usage on v1,
// cpu.stat on v2) open for UsageSinceHeld, which the daemon's readings of
// every sandbox every few seconds use: an open, a read and a close of a
// control file cost about nine times what a pread(2) of one already open
// does, and an idle sandbox's reading is that one file. A control file
// reads afresh from offset 0, so a held file gives what opening it anew
// would.
//
// The zero HeldCPU is ready to use: the file is opened at the first
// reading. Close it before the group is removed; a reading after Close
// opens the file by its path again, as UsageSince does. It is safe for
// concurrent use.
type HeldCPU struct {
	mu sync.Mutex
	// +checklocks:mu
	fd int
	// +checklocks:mu
	open bool
	// +checklocks:mu
	closed bool
}

// read reads the integer (or key's value) in the control file dir/name
// through the held descriptor, opening it first if it is not yet. A file
// that does not exist, or dir "", reads as 0 and is not held.
func (h *HeldCPU) read(dir, name, key string) (int64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return readUsage(dir, name, key)
	}
	if !h.open {
		fd, err := openControl(dir, name)
		if fd < 0 || err != nil {
			return 0, err
		}
		h.fd, h.open = fd, true
	}
	v, err := readControl(h.fd, dir, name, key)
	if err != nil {
		// The group removed under it (ENODEV), or a file gone wrong: the
		// next reading opens it afresh.
		unix.Close(h.fd)
		h.open = false
	}
	return v, err
}

// Close lets go of the held file; later readings open it by its path.
func (h *HeldCPU) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.open {
		unix.Close(h.fd)
		h.open = false
	}
	h.closed = true
}
