package quota

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// attachLoop binds image to a free loop device with LO_FLAGS_AUTOCLEAR and
// returns the device's path and an open fd on it; the device detaches when
// the last user (that fd, or a mount) lets go of it.
func attachLoop(image string) (dev string, loop *os.File, err error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return "", nil, fmt.Errorf("%w: opening /dev/loop-control: %w", ErrUnsupported, err)
	}
	defer ctl.Close()
	img, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		return "", nil, fmt.Errorf("opening image: %w", err)
	}
	defer img.Close()

	// Another process may take the free device between GET_FREE and
	// CONFIGURE; then the ioctl fails with EBUSY and we ask again.
	for range 16 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("%w: finding a free loop device: %w", ErrUnsupported, err)
		}
		dev = fmt.Sprintf("/dev/loop%d", n)
		loop, err = openLoop(dev, n)
		if err != nil {
			return "", nil, err
		}
		err = configureLoop(loop, img, image)
		if err == nil {
			return dev, loop, nil
		}
		loop.Close()
		if !errors.Is(err, unix.EBUSY) {
			return "", nil, fmt.Errorf("%w: configuring %s: %w", ErrUnsupported, dev, err)
		}
	}
	return "", nil, fmt.Errorf("configuring a loop device: no free device after 16 tries: %w", unix.EBUSY)
}

// openLoop opens /dev/loopN, creating the node if the kernel made the device
// but no node exists (a container's private /dev).
func openLoop(dev string, n int) (*os.File, error) {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		if err := unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("%w: creating %s: %w", ErrUnsupported, dev, err)
		}
		f, err = os.OpenFile(dev, os.O_RDWR, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: opening %s: %w", ErrUnsupported, dev, err)
	}
	return f, nil
}

// configureLoop binds img to loop with LOOP_CONFIGURE (direct I/O, so the
// image's pages are not cached twice), retrying without direct I/O and then
// with the older LOOP_SET_FD + LOOP_SET_STATUS64.
func configureLoop(loop, img *os.File, name string) error {
	cfg := unix.LoopConfig{Fd: uint32(img.Fd()), Size: 4096}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], name)
	err := unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
	if errors.Is(err, unix.EINVAL) {
		cfg.Size = 0
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return err
	}
	if err := unix.IoctlSetInt(int(loop.Fd()), unix.LOOP_SET_FD, int(img.Fd())); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(int(loop.Fd()), &cfg.Info); err != nil {
		unix.IoctlSetInt(int(loop.Fd()), unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}

// loopBackingFile returns the file behind a loop device such as /dev/loop3.
func loopBackingFile(dev string) (string, error) {
	name := filepath.Base(dev)
	if !strings.HasPrefix(name, "loop") {
		return "", fmt.Errorf("%s is not a loop device", dev)
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "backing_file"))
	if err != nil {
		return "", fmt.Errorf("reading backing file of %s: %w", dev, err)
	}
	return strings.TrimSpace(string(b)), nil
}

type mountInfo struct {
	mountPoint   string
	fstype       string
	source       string
	superOptions string
}

// isMountPoint tells whether path is the root of a mount, in O(1): unlike
// findMount it does not read mountinfo, whose length grows with the number
// of sandboxes. A path that does not exist is not a mount point.
func isMountPoint(path string) (bool, error) {
	var st unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, unix.STATX_BASIC_STATS, &st)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("statx %s: %w", path, err)
	}
	if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		// Kernels before 5.8 do not report it: fall back to mountinfo.
		m, err := findMount(path)
		return m != nil, err
	}
	return st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
}

// findMount returns the topmost mount at mountPoint, or nil.
func findMount(mountPoint string) (*mountInfo, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	defer f.Close()
	var found *mountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		m, ok := parseMountInfo(sc.Text())
		if ok && m.mountPoint == mountPoint {
			found = &m
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	return found, nil
}

// parseMountInfo parses one line of /proc/PID/mountinfo:
// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
func parseMountInfo(line string) (mountInfo, bool) {
	pre, post, ok := strings.Cut(line, " - ")
	if !ok {
		return mountInfo{}, false
	}
	a, b := strings.Fields(pre), strings.Fields(post)
	if len(a) < 6 || len(b) < 3 {
		return mountInfo{}, false
	}
	return mountInfo{
		mountPoint:   unescapeOctal(a[4]),
		fstype:       b[0],
		source:       unescapeOctal(b[1]),
		superOptions: b[2],
	}, true
}

// unescapeOctal undoes the kernel's \ooo escaping of space, tab, newline
// and backslash in mountinfo.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
