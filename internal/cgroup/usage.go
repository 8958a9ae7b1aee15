package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Usage reads what the group's tasks use now: their CPU time, memory and
// number of tasks (Stats without the limit and the OOM kill count, which
// the caller knows or reads apart). It is made for readings taken of
// every group at a regular interval, whose cost grows with the number of
// groups: it opens three control files (Stats opens five), each once,
// by its path without following symlinks, reads each with one read(2)
// into a buffer on the stack, and allocates nothing unless it fails. A
// control file that does not exist (its controller is not enabled) reads
// as 0.
func (g *Group) Usage() (Stats, error) {
	s, _, err := g.UsageSince(Stats{})
	return s, err
}

// UsageSince is Usage for a group last read as prev (a Usage or
// UsageSince reading; the zero Stats for none). It reads the CPU time
// first: when that has not moved since prev, none of the group's tasks
// ran, so none forked, exited or allocated memory, and it returns prev with
// ran false after opening that one control file instead of three. What
// changes a group's use without its tasks running (the kernel reclaiming
// its page cache, memory charged for a packet queued to one of its
// sockets) is missed until they run again; a caller that shows memory
// reads with a zero prev now and then.
func (g *Group) UsageSince(prev Stats) (s Stats, ran bool, err error) {
	return g.usageSince(nil, prev)
}

// UsageSinceHeld is UsageSince reading the CPU time through held, which
// keeps that control file open between readings: an idle group's reading
// is then one pread(2) instead of an open, a read and a close.
func (g *Group) UsageSinceHeld(held *HeldCPU, prev Stats) (s Stats, ran bool, err error) {
	return g.usageSince(held, prev)
}

func (g *Group) usageSince(held *HeldCPU, prev Stats) (s Stats, ran bool, err error) {
	get := func(v *int64, dir, name, key string) {
		n, rerr := readUsage(dir, name, key)
		if rerr != nil {
			err = errors.Join(err, rerr)
		}
		*v = n
	}
	var cpu int64
	dir, name, key := g.dirs["cpuacct"], "cpuacct.usage", ""
	if g.v2() {
		dir, name, key = g.dirs[""], "cpu.stat", "usage_usec"
	}
	if held != nil {
		cpu, err = held.read(dir, name, key)
	} else {
		get(&cpu, dir, name, key)
	}
	if g.v2() {
		cpu *= 1000
	}
	if err == nil && cpu > 0 && time.Duration(cpu) == prev.CPUUsage {
		return prev, false, nil
	}
	if g.v2() {
		d := g.dirs[""]
		get(&s.MemoryBytes, d, "memory.current", "")
		get(&s.Pids, d, "pids.current", "")
	} else {
		get(&s.MemoryBytes, g.dirs["memory"], "memory.usage_in_bytes", "")
		get(&s.Pids, g.dirs["pids"], "pids.current", "")
	}
	s.CPUUsage = time.Duration(cpu)
	if err != nil {
		return s, true, fmt.Errorf("reading usage of cgroup %s: %w", g.id, err)
	}
	return s, true, nil
}

// usagePathMax bounds dir/name for readUsage (a cgroup's directory is a
// short path: the hierarchy's root, fence's parent and the group's id).
const usagePathMax = 512

// usageFileMax bounds what readUsage reads of a file: one integer, or
// cpu.stat's few lines.
const usageFileMax = 1024

// atFDCWD is AT_FDCWD as a system call argument.
var atFDCWD = uintptr(^uintptr(-unix.AT_FDCWD - 1))

// controlOpens counts the control files opened (by openFile and
// readUsage), for tests.
var controlOpens atomic.Int64

// readUsage reads the integer in the control file dir/name, or with key
// set the value of key in it ("key value" lines), without allocating
// (see Usage). A file that does not exist, or dir "", reads as 0.
func readUsage(dir, name, key string) (int64, error) {
	fd, err := openControl(dir, name)
	if fd < 0 || err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return readControl(fd, dir, name, key)
}

// openControl opens the control file dir/name for reading without
// following symlinks; -1 and no error when it does not exist or dir is "".
func openControl(dir, name string) (int, error) {
	if dir == "" {
		return -1, nil
	}
	var path [usagePathMax]byte
	if len(dir)+1+len(name)+1 > len(path) {
		return -1, fmt.Errorf("reading %s/%s: path too long", dir, name)
	}
	n := copy(path[:], dir)
	path[n] = '/'
	n++
	n += copy(path[n:], name)
	path[n] = 0
	how := unix.OpenHow{
		Flags:   uint64(unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: unix.RESOLVE_NO_SYMLINKS,
	}
	controlOpens.Add(1)
	fd, _, errno := syscall.Syscall6(unix.SYS_OPENAT2, atFDCWD, uintptr(unsafe.Pointer(&path[0])),
		uintptr(unsafe.Pointer(&how)), unsafe.Sizeof(how), 0, 0)
	if errno == unix.ENOSYS {
		fd, _, errno = syscall.Syscall(unix.SYS_OPENAT, atFDCWD, uintptr(unsafe.Pointer(&path[0])),
			uintptr(unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW))
	}
	if errno == unix.ENOENT {
		return -1, nil
	}
	if errno != 0 {
		return -1, fmt.Errorf("opening %s/%s: %w", dir, name, errno)
	}
	return int(fd), nil
}

// readControl reads control file fd (dir/name) from its start, as
// readUsage does: a control file reads afresh at offset 0 whatever was
// read of it before.
func readControl(fd int, dir, name, key string) (int64, error) {
	var buf [usageFileMax]byte
	got, err := unix.Pread(fd, buf[:], 0)
	for err == unix.EINTR {
		got, err = unix.Pread(fd, buf[:], 0)
	}
	if err != nil {
		return 0, fmt.Errorf("reading %s/%s: %w", dir, name, err)
	}
	v, ok := parseUsage(buf[:got], key)
	if !ok {
		return 0, fmt.Errorf("parsing %s/%s: %q has no number", dir, name, string(buf[:got]))
	}
	return v, nil
}

// parseUsage parses the contents of a control file: one integer, or with
// key set the value of key in "key value" lines (0 when there is none).
func parseUsage(b []byte, key string) (int64, bool) {
	if key != "" {
		b = valueOf(b, key)
	}
	return parseDecimal(bytes.TrimSpace(b))
}

// valueOf returns the value of key in the "key value" lines of b, or "0"
// when b has no such line.
func valueOf(b []byte, key string) []byte {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(line) > len(key) && string(line[:len(key)]) == key && line[len(key)] == ' ' {
			return line[len(key)+1:]
		}
	}
	return zero
}

var zero = []byte("0")

// parseDecimal parses a non-negative decimal integer that fits an int64.
func parseDecimal(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if v < 0 {
		return 0, false
	}
	return v, true
}
