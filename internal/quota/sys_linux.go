package quota

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/api"
)

// loopMu serializes this process's loop attaches. Each asks the kernel
// for the lowest free device and then binds it: two attaches in between
// are handed the same device, and all but one fail and ask again. A
// daemon's concurrent creates (and its disk pool's refills) so raced each
// other, and on a loaded host, where each is descheduled between the two
// steps, one could lose every try. Other processes' attaches may still
// take a device first; those losses are retried.
var loopMu sync.Mutex

// loopTries is how many free devices an attach tries to bind before it
// gives up: each loss is to another process binding that device between
// the kernel's answer and the bind.
const loopTries = 16

// afterGetFree, when set (by tests), runs between the kernel's answer
// naming free device n and the attempt to bind it.
var afterGetFree func(n int)

// attachLoop binds image to a free loop device with LO_FLAGS_AUTOCLEAR and
// returns the device's path and an open fd on it; the device detaches when
// the last user (that fd, or a mount) lets go of it. When other processes
// took each free device first, the error wraps api.ErrUnavailable: the
// host is busy, a later try may succeed.
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
	loopMu.Lock()
	defer loopMu.Unlock()
	for range loopTries {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("%w: finding a free loop device: %w", ErrUnsupported, err)
		}
		if afterGetFree != nil {
			afterGetFree(n)
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
	return "", nil, fmt.Errorf("configuring a loop device: other processes took each of %d free devices first: %w: %w",
		loopTries, unix.EBUSY, api.ErrUnavailable)
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

// findMount returns the topmost mount at mountPoint, or nil. mountinfo
// names mount points as the kernel resolves them: mountPoint is compared
// with symlinks followed.
func findMount(mountPoint string) (*mountInfo, error) {
	mountPoint = resolved(mountPoint)
	var found *mountInfo
	err := eachMount(func(m mountInfo) {
		if m.mountPoint == mountPoint {
			found = &m
		}
	})
	return found, err
}

// countMounts returns how many mounts are stacked at mountPoint (symlinks
// followed).
func countMounts(mountPoint string) (int, error) {
	mountPoint = resolved(mountPoint)
	n := 0
	err := eachMount(func(m mountInfo) {
		if m.mountPoint == mountPoint {
			n++
		}
	})
	return n, err
}

// eachMount calls fn with each mount of this mount namespace, in
// mountinfo's order (a mount after those it is stacked on).
func eachMount(fn func(mountInfo)) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("reading mountinfo: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if m, ok := parseMountInfo(sc.Text()); ok {
			fn(m)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading mountinfo: %w", err)
	}
	return nil
}

// resolved returns path with its symlinks followed, or path itself if it
// cannot be resolved (it does not exist).
func resolved(path string) string {
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	return path
}

// maxStacked bounds unmountAll: more mounts than this stacked at one
// point is not something fence made.
const maxStacked = 1024

// unmountAll detaches every mount at dir, however many are stacked there,
// each with everything mounted below it, until dir is no mount point.
// What a detached mount held (a loop device, a filesystem) is released
// once nothing uses it any more.
func unmountAll(dir string) error {
	for range maxStacked {
		mounted, err := isMountPoint(dir)
		if err != nil || !mounted {
			return err
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting %s: %w", dir, err)
		}
	}
	return fmt.Errorf("unmounting %s: still a mount point after %d unmounts", dir, maxStacked)
}

// resetMounts unmounts everything at MountDir (unmountAll) and then
// releases the loop devices whose image is gone (releaseOrphanLoops).
func (f *FS) resetMounts() error {
	if err := unmountAll(f.mountDir); err != nil {
		return err
	}
	if n := f.releaseOrphanLoops(); n > 0 {
		f.log.Info("released loop devices whose disk image was gone", "count", n, "image_dir", f.imageDir)
	}
	return nil
}

// releaseOrphanLoops releases the loop devices backed by an image under
// ImageDir that no longer exists (a crash, or an earlier run that could not
// reach its mounts): it unmounts their mounts under MountDir and clears
// them (LOOP_CLR_FD, which a device still in use elsewhere, in a mount
// namespace of its own, turns into a detach at its last close). Devices
// backed by anything else are left alone. It returns how many it cleared.
func (f *FS) releaseOrphanLoops() int {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	orphans := map[string]bool{} // device path
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // detached meanwhile
		}
		backing := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if !strings.HasPrefix(backing, f.imageDir+"/") {
			continue
		}
		if _, err := os.Lstat(backing); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		orphans["/dev/"+filepath.Base(filepath.Dir(filepath.Dir(p)))] = true
	}
	if len(orphans) == 0 {
		return 0
	}
	var mps []string
	_ = eachMount(func(m mountInfo) {
		if orphans[m.source] && strings.HasPrefix(m.mountPoint, f.mountDir+"/") {
			mps = append(mps, m.mountPoint)
		}
	})
	for _, mp := range mps {
		unmountAll(mp)
	}
	n := 0
	for dev := range orphans {
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err == nil {
			n++
		} else {
			f.log.Debug("clearing a loop device whose image is gone", "device", dev, "err", err)
		}
		unix.Close(fd)
	}
	return n
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
