package probe

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Paths the native backend masks (files: /dev/null bound over them; dirs:
// an empty read-only tmpfs). A path the kernel does not have is skipped.
var (
	maskedFiles = []string{
		"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/timer_stats",
		"/proc/sched_debug", "/proc/interrupts", "/proc/latency_stats",
	}
	maskedDirs = []string{
		"/proc/acpi", "/proc/asound", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
)

func checkProcMasks([]string) error {
	for _, p := range maskedFiles {
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			continue
		}
		if err != nil {
			return fmt.Errorf("opening %s: %w", p, err)
		}
		n, _ := io.ReadFull(f, make([]byte, 64))
		f.Close()
		if n > 0 {
			return escapef("%s is readable (%d bytes or more)", p, n)
		}
	}
	for _, p := range maskedDirs {
		ents, err := os.ReadDir(p)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			continue
		}
		if err != nil {
			return fmt.Errorf("listing %s: %w", p, err)
		}
		if len(ents) > 0 {
			return escapef("%s shows %d entries (e.g. %s)", p, len(ents), ents[0].Name())
		}
	}
	return nil
}

func openWriteRefused(paths ...string) func([]string) error {
	return func([]string) error {
		for _, p := range paths {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err == nil {
				f.Close()
				return escapef("%s opened for writing", p)
			}
		}
		return nil
	}
}

// readOnlyMount fails unless the file system at path is mounted read-only.
func readOnlyMount(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", path, err)
	}
	if st.Flags&unix.ST_RDONLY == 0 {
		return escapef("%s is mounted read-write", path)
	}
	return nil
}

func checkProcSysRO(args []string) error {
	if err := readOnlyMount("/proc/sys"); err != nil {
		return err
	}
	// kernel/hostname belongs to the sandbox's own UTS namespace: only the
	// read-only mount keeps sandbox root from writing it.
	return openWriteRefused("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe",
		"/proc/sys/kernel/hostname", "/proc/sys/vm/panic_on_oom")(args)
}

func checkSysRO(args []string) error {
	if err := readOnlyMount("/sys"); err != nil {
		return err
	}
	return openWriteRefused("/sys/kernel/uevent_helper")(args)
}

// allowedDevices are the character devices a sandbox's /dev may hold, as
// major:minor: null, zero, full, random, urandom, tty, and devpts' ptmx.
// Pseudo-terminal slaves (majors 136–143) are allowed too.
var allowedDevices = map[[2]uint32]string{
	{1, 3}: "null", {1, 5}: "zero", {1, 7}: "full", {1, 8}: "random", {1, 9}: "urandom",
	{5, 0}: "tty", {5, 2}: "ptmx",
}

func checkDevices([]string) error {
	var bad []string
	err := filepath.WalkDir("/dev", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeDevice == 0 {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		dev := [2]uint32{unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))}
		switch {
		case d.Type()&fs.ModeCharDevice == 0:
			bad = append(bad, fmt.Sprintf("block device %s (%d:%d)", p, dev[0], dev[1]))
		case allowedDevices[dev] != "":
		case dev[0] >= 136 && dev[0] <= 143 && strings.HasPrefix(p, "/dev/pts/"):
		default:
			bad = append(bad, fmt.Sprintf("character device %s (%d:%d)", p, dev[0], dev[1]))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("walking /dev: %w", err)
	}
	if len(bad) > 0 {
		return escapef("%s", strings.Join(bad, ", "))
	}
	return nil
}

func checkMknod([]string) error {
	for _, n := range []struct {
		path string
		mode uint32
		dev  int
	}{
		{"/tmp/probe-sda", unix.S_IFBLK | 0o600, int(unix.Mkdev(8, 0))},
		{"/tmp/probe-mem", unix.S_IFCHR | 0o600, int(unix.Mkdev(1, 1))},
	} {
		if err := unix.Mknod(n.path, n.mode, n.dev); err == nil {
			os.Remove(n.path)
			return escapef("mknod %s succeeded", n.path)
		}
	}
	return nil
}

// checkFDs looks for descriptors beyond stdio that the probe did not open
// itself. Exec closes every close-on-exec descriptor, and everything Go
// opens (the runtime's epoll and eventfd included) is close-on-exec, so a
// descriptor without FD_CLOEXEC was inherited from whoever started the
// probe.
func checkFDs([]string) error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	var extra []string
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n <= 2 {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(n), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC != 0 {
			continue // closed since (ReadDir's own) or opened here
		}
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		extra = append(extra, e.Name()+"->"+target)
	}
	if len(extra) > 0 {
		return escapef("inherited descriptors: %v", extra)
	}
	return nil
}

func checkAgentProc([]string) error {
	for _, f := range []string{"/proc/1/mem", "/proc/1/environ"} {
		if fd, err := os.Open(f); err == nil {
			fd.Close()
			return escapef("%s of the agent opened", f)
		}
	}
	// Listing /proc/1/fd shows numbers only; following an entry needs
	// ptrace access, which a non-dumpable agent denies.
	ents, _ := os.ReadDir("/proc/1/fd")
	for _, e := range ents {
		p := "/proc/1/fd/" + e.Name()
		if t, err := os.Readlink(p); err == nil {
			return escapef("%s of the agent readable: %s", p, t)
		}
		if f, err := os.Open(p); err == nil {
			f.Close()
			return escapef("%s of the agent opened", p)
		}
	}
	return nil
}

// checkPtraceInit attaches to PID 1; should it work, the probe detaches
// and resumes it (an attach leaves the target stopped).
func checkPtraceInit([]string) error {
	if os.Getpid() == 1 {
		return errors.New("the probe is PID 1")
	}
	err := unix.PtraceAttach(1)
	if err == nil {
		unix.PtraceDetach(1)
		unix.Kill(1, unix.SIGCONT)
	}
	return refused("ptrace(ATTACH, 1) by pid "+strconv.Itoa(os.Getpid()), err)
}

// checkExeWrite attacks the binary this probe runs from, which in a
// sandbox is fence's own (the agent's) binary bound from the host.
func checkExeWrite([]string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := readOnlyMount(self); err != nil {
		return err
	}
	return openWriteRefused(self, "/proc/self/exe", "/proc/1/exe")(nil)
}
