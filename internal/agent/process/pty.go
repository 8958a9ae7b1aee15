package process

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// openPTY opens a new pseudo-terminal pair. The master is pollable (so
// Close interrupts a pending Read); the slave is for the child.
func openPTY() (master, slave *os.File, err error) {
	master, err = openPTMX()
	if err != nil {
		return nil, nil, err
	}
	var n int
	err = control(master, func(fd int) error {
		var err error
		if n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN); err != nil {
			return err
		}
		return unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0)
	})
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("setting up pty: %w", err)
	}
	name := "/dev/pts/" + strconv.Itoa(n)
	slave, err = os.OpenFile(name, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("opening %s: %w", name, err)
	}
	return master, slave, nil
}

// ptmxPaths are the multiplexers tried in order: /dev/ptmx is usually a
// symlink to the private devpts instance's own pts/ptmx, which is used
// directly when the symlink is missing.
var ptmxPaths = []string{"/dev/ptmx", "/dev/pts/ptmx"}

func openPTMX() (*os.File, error) {
	var first error
	for _, p := range ptmxPaths {
		f, err := os.OpenFile(p, os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err == nil {
			return f, nil
		}
		if first == nil {
			first = fmt.Errorf("opening %s: %w", p, err)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	return nil, first
}

// setSize sets the window size of the terminal behind f.
func setSize(f *os.File, cols, rows uint32) error {
	return control(f, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
	})
}

func control(f *os.File, fn func(fd int) error) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := sc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
