package nsinit

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The sandbox's /proc, /sys and /dev are mounts of its own namespaces:
// nothing in them depends on its template or Config. An init builds them
// while it waits for its sandbox, as detached mount trees (fsmount, with
// their masks and devices moved onto paths inside them), and attaching
// them to a root is then one move_mount each: three calls on the create's
// path instead of some thirty, each of which takes the kernel's global
// mount lock that every other sandbox's setup and teardown also takes.
//
// Mounting onto a path inside a detached tree needs Linux 6.15 or later.
// On an older kernel the build fails, and the same trees are made at the
// create instead: each bare mount is attached first and filled in place
// (fillProc, fillSys, fillDev), so one set of mounts serves both.

// DefaultShmBytes is the size of a sandbox's /dev/shm, and the size of
// the one an init builds ahead. A Config with another size gets a /dev
// made at its create.
const DefaultShmBytes = 64 << 20

// trees holds an init's detached /proc, /sys and /dev (descriptors of
// fsmount or open_tree), and its agent binary's bind; -1 where not built.
type trees struct {
	proc, sys, dev, agent int
}

var noTrees = trees{-1, -1, -1, -1}

// buildTrees makes the trees as detached mounts. On error nothing is
// left open.
func buildTrees() (t trees, err error) {
	t = noTrees
	e := emptyDirs{-1}
	defer e.close()
	defer func() {
		if err != nil {
			t.close()
			t = noTrees
		}
	}()
	if t.proc, err = newProc(); err != nil {
		return t, err
	}
	if err = fillProc(t.proc, &e); err != nil {
		return t, err
	}
	if t.sys, err = newSys(); err != nil {
		return t, err
	}
	if err = fillSys(t.sys, &e); err != nil {
		return t, err
	}
	if t.dev, err = newDev(); err != nil {
		return t, err
	}
	if err = fillDev(t.dev, DefaultShmBytes); err != nil {
		return t, err
	}
	if err = bindBootID(t.proc, t.dev); err != nil {
		return t, err
	}
	if t.agent, err = cloneMount(unix.AT_FDCWD, "/proc/self/exe", agentAttr); err != nil {
		return t, fmt.Errorf("cloning the agent binary: %w", err)
	}
	return t, nil
}

func (t *trees) close() {
	for _, fd := range []*int{&t.proc, &t.sys, &t.dev, &t.agent} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// attachTrees gives root its /.fence/fence, /proc, /sys and /dev: the
// trees built ahead where there are some (and the Config's /dev/shm is the
// default size), else mounts made and filled now. It closes t.
func attachTrees(root string, t trees, shmBytes int64) error {
	defer t.close()
	e := emptyDirs{-1}
	defer e.close()
	bootIDBound := t.proc >= 0 // with the trees built ahead
	if shmBytes != DefaultShmBytes && t.dev >= 0 {
		unix.Close(t.dev)
		t.dev = -1
	}
	if t.agent < 0 {
		var err error
		if t.agent, err = cloneMount(unix.AT_FDCWD, "/proc/self/exe", agentAttr); err != nil {
			return fmt.Errorf("cloning the agent binary: %w", err)
		}
	}
	if err := attach(root, agentPath, kindFile, t.agent); err != nil {
		return fmt.Errorf("mounting the agent binary: %w", err)
	}
	mounts := []struct {
		path string
		fd   int
		mk   func() (int, error)
		fill func(int) error
	}{
		{"/proc", t.proc, newProc, func(fd int) error { return fillProc(fd, &e) }},
		{"/sys", t.sys, newSys, func(fd int) error { return fillSys(fd, &e) }},
		{"/dev", t.dev, newDev, func(fd int) error { return fillDev(fd, shmBytes) }},
	}
	for _, m := range mounts {
		if m.fd >= 0 {
			if err := attach(root, m.path, kindDir, m.fd); err != nil {
				return fmt.Errorf("mounting %s: %w", m.path, err)
			}
			continue
		}
		fd, err := m.mk()
		if err != nil {
			return err
		}
		err = attach(root, m.path, kindDir, fd)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("mounting %s: %w", m.path, err)
		}
		// Filled in place: the descriptor taken before the attach names
		// the directory underneath.
		in, err := openInRoot(root, m.path, kindExisting)
		if err != nil {
			return fmt.Errorf("opening %s: %w", m.path, err)
		}
		err = m.fill(in)
		unix.Close(in)
		if err != nil {
			return err
		}
	}
	if bootIDBound {
		return nil
	}
	proc, err := openInRoot(root, "/proc", kindExisting)
	if err != nil {
		return fmt.Errorf("opening /proc: %w", err)
	}
	defer unix.Close(proc)
	dev, err := openInRoot(root, "/dev", kindExisting)
	if err != nil {
		return fmt.Errorf("opening /dev: %w", err)
	}
	defer unix.Close(dev)
	return bindBootID(proc, dev)
}

// bootIDPath is the boot's ID below /proc, and bootIDFile the name of its
// per-boot copy, in /dev (the sandbox's own tmpfs) until it is bound.
const (
	bootIDPath = "sys/kernel/random/boot_id"
	bootIDFile = ".boot_id"
)

// bindBootID gives the proc mount p a boot ID of its own: a file with a
// new random UUID, made in the sandbox's /dev tmpfs d, bound read-only
// over p's /proc/sys/kernel/random/boot_id, and unlinked from d (the bind
// keeps it). Each start of a sandbox is a boot with its own init, so its
// programs see a new boot ID at each, as on a machine that rebooted, and
// never the host's.
func bindBootID(p, d int) error {
	id, err := newBootID()
	if err != nil {
		return err
	}
	f, err := unix.Openat(d, bootIDFile, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o444)
	if err != nil {
		return fmt.Errorf("preparing the boot ID: %w", err)
	}
	defer unix.Unlinkat(d, bootIDFile, 0)
	_, err = unix.Write(f, id)
	unix.Close(f)
	if err != nil {
		return fmt.Errorf("writing the boot ID: %w", err)
	}
	fd, err := cloneMount(d, bootIDFile, unix.MOUNT_ATTR_RDONLY|noExec)
	if err == nil {
		err = moveOnto(fd, p, bootIDPath)
	}
	if err != nil {
		return fmt.Errorf("binding the boot ID: %w", err)
	}
	return nil
}

// newBootID returns a random (version 4) UUID as the kernel writes a boot
// ID: 36 lower-case characters and a newline.
func newBootID() ([]byte, error) {
	var b [16]byte
	if n, err := unix.Getrandom(b[:], 0); err != nil || n != len(b) {
		return nil, fmt.Errorf("drawing a boot ID: %d bytes, %v", n, err)
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	const hexDigits = "0123456789abcdef"
	out := make([]byte, 0, 37)
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hexDigits[c>>4], hexDigits[c&0xf])
	}
	return append(out, '\n'), nil
}

// attach moves the mount tree fd onto path inside root, made as kind.
func attach(root, path string, kind pathKind, fd int) error {
	target, err := openInRoot(root, path, kind)
	if err != nil {
		return err
	}
	defer unix.Close(target)
	return unix.MoveMount(fd, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
}

const agentAttr = unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV

// newMount makes a detached mount of a new fstype filesystem with the
// given options and mount attributes.
func newMount(fstype string, attr uint64, opts ...string) (int, error) {
	fsfd, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("opening a %s filesystem: %w", fstype, err)
	}
	defer unix.Close(fsfd)
	// The source names the filesystem in the sandbox's mount table, as
	// mount(8) would.
	opts = append([]string{"source", fstype}, opts...)
	for i := 0; i+1 < len(opts); i += 2 {
		if opts[i+1] == "" {
			err = unix.FsconfigSetFlag(fsfd, opts[i])
		} else {
			err = unix.FsconfigSetString(fsfd, opts[i], opts[i+1])
		}
		if err != nil {
			return -1, fmt.Errorf("configuring %s (%s): %w", fstype, opts[i], err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("creating a %s filesystem: %w", fstype, err)
	}
	fd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, int(attr))
	if err != nil {
		return -1, fmt.Errorf("mounting %s: %w", fstype, err)
	}
	return fd, nil
}

// cloneMount returns a detached copy of the mount tree at path (relative
// to dirfd; dirfd's own mount if path is "") with attr set on all of it.
func cloneMount(dirfd int, path string, attr uint64) (int, error) {
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_RECURSIVE
	if path == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	fd, err := unix.OpenTree(dirfd, path, uint(flags))
	if err != nil {
		return -1, err
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: attr}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("setting mount attributes: %w", err)
	}
	return fd, nil
}

// moveOnto moves the mount fd onto path below the mount dir (a tree's
// root, attached or not) and closes fd.
func moveOnto(fd, dir int, path string) error {
	defer unix.Close(fd)
	return unix.MoveMount(fd, "", dir, path, unix.MOVE_MOUNT_F_EMPTY_PATH)
}

// exists reports whether path below dir exists (not following a final
// symlink: none of the masked paths is one).
func exists(dir int, path string) (bool, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dir, path, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	return err == nil, err
}

const noExec = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC

func newProc() (int, error) { return newMount("proc", noExec) }

func newSys() (int, error) { return newMount("sysfs", noExec|unix.MOUNT_ATTR_RDONLY, "ro", "") }

func newDev() (int, error) {
	return newMount("tmpfs", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC,
		"mode", "0755", "size", "65536", "nr_inodes", "4096")
}

// fillProc makes readOnlyPaths read-only and masks maskedFiles and
// maskedDirs (with clones from e) of the proc mount p.
func fillProc(p int, e *emptyDirs) error {
	readOnly := func(rel string) (int, error) {
		return cloneMount(p, rel, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	}
	if err := cover(p, "/proc/", readOnlyPaths, "making %s read-only: %w", readOnly); err != nil {
		return err
	}
	return mask(p, "/proc/", maskedFiles, maskedDirs, e)
}

// fillSys masks maskedDirs of the sysfs mount s, with clones from e.
func fillSys(s int, e *emptyDirs) error { return mask(s, "/sys/", nil, maskedDirs, e) }

// emptyDirs makes the mounts that mask directories: each is a read-only
// clone of one empty, read-only tmpfs made at the first, so that a
// sandbox holds one filesystem for all its masks rather than one each
// (every filesystem is a superblock, and each superblock costs every
// memory cgroup made later some of its shrinker state).
type emptyDirs struct {
	fd int // the empty tmpfs, detached; -1 until the first mask
}

// mount returns a new mount of the empty tmpfs.
func (e *emptyDirs) mount(string) (int, error) {
	if e.fd < 0 {
		fd, err := newMount("tmpfs", noExec|unix.MOUNT_ATTR_RDONLY, "ro", "", "size", "0", "nr_inodes", "16", "mode", "0555")
		if err != nil {
			return -1, err
		}
		e.fd = fd
	}
	return cloneMount(e.fd, "", noExec|unix.MOUNT_ATTR_RDONLY)
}

func (e *emptyDirs) close() {
	if e.fd >= 0 {
		unix.Close(e.fd)
		e.fd = -1
	}
}

// mask covers those of files (with the host's /dev/null) and dirs (with
// mounts of e) that lie below prefix, relative to mount m.
func mask(m int, prefix string, files, dirs []string, e *emptyDirs) error {
	null := func(string) (int, error) {
		return cloneMount(unix.AT_FDCWD, "/dev/null", unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	}
	if err := cover(m, prefix, files, "masking %s: %w", null); err != nil {
		return err
	}
	return cover(m, prefix, dirs, "masking %s: %w", e.mount)
}

// cover moves onto each of paths that lies below prefix and exists,
// relative to mount m, the mount mk makes for it; errf formats a failure
// with the path.
func cover(m int, prefix string, paths []string, errf string, mk func(rel string) (int, error)) error {
	for _, path := range paths {
		rel, ok := strings.CutPrefix(path, prefix)
		if !ok || rel == "" {
			continue
		}
		if ok, err := exists(m, rel); err != nil {
			return fmt.Errorf("opening %s: %w", path, err)
		} else if !ok {
			continue
		}
		fd, err := mk(rel)
		if err == nil {
			err = moveOnto(fd, m, rel)
		}
		if err != nil {
			return fmt.Errorf(errf, path, err)
		}
	}
	return nil
}

// fillDev gives the tmpfs mount d the host's harmless devices (bound from
// the host's /dev: trusted, the sandbox's root is not yet in place), a
// devpts of its own, a /dev/shm of shmBytes and the usual links.
func fillDev(d int, shmBytes int64) error {
	for _, name := range devices {
		f, err := unix.Openat(d, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644)
		if err != nil {
			return fmt.Errorf("preparing /dev/%s: %w", name, err)
		}
		unix.Close(f)
		fd, err := cloneMount(unix.AT_FDCWD, "/dev/"+name, unix.MOUNT_ATTR_NOSUID)
		if err == nil {
			err = moveOnto(fd, d, name)
		}
		if err != nil {
			return fmt.Errorf("binding /dev/%s: %w", name, err)
		}
	}
	for _, sub := range []struct {
		name string
		mk   func() (int, error)
	}{
		{"pts", func() (int, error) {
			return newMount("devpts", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC,
				"newinstance", "", "ptmxmode", "0666", "mode", "0620", "gid", "5")
		}},
		{"shm", func() (int, error) {
			return newMount("tmpfs", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV,
				"mode", "1777", "size", strconv.FormatInt(shmBytes, 10), "nr_inodes", strconv.FormatInt(shmInodes(shmBytes), 10))
		}},
	} {
		if err := unix.Mkdirat(d, sub.name, 0o755); err != nil {
			return fmt.Errorf("preparing /dev/%s: %w", sub.name, err)
		}
		fd, err := sub.mk()
		if err == nil {
			err = moveOnto(fd, d, sub.name)
		}
		if err != nil {
			return fmt.Errorf("mounting /dev/%s: %w", sub.name, err)
		}
	}
	links := [][2]string{
		{"pts/ptmx", "ptmx"}, {"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"},
		{"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"},
	}
	for _, l := range links {
		if err := unix.Symlinkat(l[0], d, l[1]); err != nil {
			return fmt.Errorf("creating /dev/%s: %w", l[1], err)
		}
	}
	return nil
}
