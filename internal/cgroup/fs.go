package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// openFile opens dir/name without following any symlink on the way.
func openFile(dir, name string, flags int) (*os.File, error) {
	path := filepath.Join(dir, name)
	controlOpens.Add(1)
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: unix.RESOLVE_NO_SYMLINKS,
	})
	if errors.Is(err, unix.ENOSYS) {
		fd, err = unix.Open(path, flags|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// wrote, when set (by tests), is called with the name of each control
// file written.
var wrote func(name string)

// writeFile writes data to the control file dir/name in one write(2), as
// cgroupfs expects.
func writeFile(dir, name, data string) error {
	if wrote != nil {
		wrote(name)
	}
	f, err := openFile(dir, name, unix.O_WRONLY)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte(data))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %q to %s: %w", data, f.Name(), err)
	}
	return nil
}

func readFile(dir, name string) ([]byte, error) {
	f, err := openFile(dir, name, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", f.Name(), err)
	}
	return b, nil
}

func readFields(dir, name string) ([]string, error) {
	b, err := readFile(dir, name)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// readInt reads a file holding one integer, or "max" (returned as 0).
func readInt(dir, name string) (int64, error) {
	b, err := readFile(dir, name)
	if err != nil {
		return 0, err
	}
	s := string(bytes.TrimSpace(b))
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing %s/%s: %w", dir, name, err)
	}
	return n, nil
}

// readKey reads the value of key in a flat keyed file ("key value" lines).
func readKey(dir, name, key string) (int64, error) {
	b, err := readFile(dir, name)
	if err != nil {
		return 0, err
	}
	n, err := keyIn(b, key)
	if err != nil {
		return 0, fmt.Errorf("parsing %s in %s/%s: %w", key, dir, name, err)
	}
	return n, nil
}

// keyIn returns the value of key in the contents of a flat keyed file,
// 0 if it has none.
func keyIn(b []byte, key string) (int64, error) {
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && k == key {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, nil
}

// readPids reads cgroup.procs.
func readPids(dir string) ([]int, error) {
	fields, err := readFields(dir, "cgroup.procs")
	if err != nil {
		return nil, err
	}
	pids := make([]int, 0, len(fields))
	for _, f := range fields {
		p, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parsing %s/cgroup.procs: %w", dir, err)
		}
		pids = append(pids, p)
	}
	return pids, nil
}

// openEvents opens dir's cgroup.events for eventsKey and poll(2).
func openEvents(dir string) (int, error) {
	fd, err := unix.Open(filepath.Join(dir, "cgroup.events"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening %s/cgroup.events: %w", dir, err)
	}
	return fd, nil
}

// eventsKey reads key from an open cgroup.events from its start; the read
// also arms the next POLLPRI.
func eventsKey(fd int, key string) (int64, error) {
	var buf [512]byte
	n, err := unix.Pread(fd, buf[:], 0)
	if err != nil {
		return 0, fmt.Errorf("reading cgroup.events: %w", err)
	}
	return keyIn(buf[:n], key)
}
