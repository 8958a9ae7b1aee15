// Package btrfs drives the few btrfs ioctls fence's layer store uses:
// creating, snapshotting and deleting subvolumes, and limiting and reading
// a subvolume's disk use through simple quotas.
//
// # Guarantees
//
//   - Every operation names its subvolume as one path element below a
//     directory descriptor (no path is resolved here, no symlink
//     followed) or by a descriptor of the subvolume itself.
//   - A snapshot is made by the kernel in one transaction: it exists
//     complete (read-only if asked) or not at all. Its cost does not grow
//     with the number of files in the subvolume (the kernel flushes the
//     subvolume's dirty data first, which costs what is dirty).
//   - Nothing here needs btrfs-progs: only mkfs.btrfs (Mkfs) does.
package btrfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNotBtrfs is returned for a path that is not on a btrfs filesystem.
var ErrNotBtrfs = errors.New("not on a btrfs filesystem")

const (
	ioctlMagic = 0x94
	// firstFreeObjectID is the inode number of every subvolume's root.
	firstFreeObjectID = 256
	subvolRDONLY      = 1 << 1

	quotaCtlEnableSimple = 4 // BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA (Linux 6.7)
	qgroupLimitMaxRfer   = 1 << 0
	qgroupLimitMaxExcl   = 1 << 1
)

func iow(nr, size uintptr) uintptr  { return 1<<30 | size<<16 | ioctlMagic<<8 | nr }
func ior(nr, size uintptr) uintptr  { return 2<<30 | size<<16 | ioctlMagic<<8 | nr }
func iowr(nr, size uintptr) uintptr { return 3<<30 | size<<16 | ioctlMagic<<8 | nr }

// volArgsV2 is struct btrfs_ioctl_vol_args_v2 (4096 bytes).
type volArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [4040]byte
}

// volArgs is struct btrfs_ioctl_vol_args (4096 bytes).
type volArgs struct {
	fd   int64
	name [4088]byte
}

type quotaCtlArgs struct{ cmd, status uint64 }

type qgroupLimitArgs struct {
	qgroupid                                  uint64
	flags, maxRfer, maxExcl, rsvRfer, rsvExcl uint64
}

type inoLookupArgs struct {
	treeid, objectid uint64
	name             [4080]byte
}

type fsInfoArgs struct {
	maxID, numDevices uint64
	fsid              [16]byte
	rest              [1024 - 32]byte
}

var (
	iocSnapCreateV2   = iow(23, unsafe.Sizeof(volArgsV2{}))
	iocSubvolCreateV2 = iow(24, unsafe.Sizeof(volArgsV2{}))
	iocSnapDestroy    = iow(15, unsafe.Sizeof(volArgs{}))
	iocQuotaCtl       = iowr(40, unsafe.Sizeof(quotaCtlArgs{}))
	iocQgroupLimit    = ior(43, unsafe.Sizeof(qgroupLimitArgs{}))
	iocInoLookup      = iowr(18, unsafe.Sizeof(inoLookupArgs{}))
	iocFSInfo         = ior(31, unsafe.Sizeof(fsInfoArgs{}))
)

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || len(name) > 255 {
		return fmt.Errorf("invalid subvolume name %q", name)
	}
	return nil
}

// IsBtrfs tells whether path is on a btrfs filesystem.
func IsBtrfs(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, err
	}
	return st.Type == unix.BTRFS_SUPER_MAGIC, nil
}

// IsSubvolume tells whether name below dirfd is a subvolume's root (not
// following a symlink).
func IsSubvolume(dirfd int, name string) bool {
	var st unix.Stat_t
	if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Ino != firstFreeObjectID || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false
	}
	var fs unix.Statfs_t
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return unix.Fstatfs(fd, &fs) == nil && fs.Type == unix.BTRFS_SUPER_MAGIC
}

// CreateSubvolume makes an empty subvolume name below dirfd.
func CreateSubvolume(dirfd int, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	var a volArgsV2
	copy(a.name[:], name)
	if err := ioctl(dirfd, iocSubvolCreateV2, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("creating subvolume %s: %w", name, err)
	}
	return nil
}

// Snapshot makes name below dirfd a snapshot of the subvolume whose root
// is src, read-only if asked.
func Snapshot(src, dirfd int, name string, readOnly bool) error {
	if err := checkName(name); err != nil {
		return err
	}
	a := volArgsV2{fd: int64(src)}
	if readOnly {
		a.flags = subvolRDONLY
	}
	copy(a.name[:], name)
	if err := ioctl(dirfd, iocSnapCreateV2, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("snapshotting into %s: %w", name, err)
	}
	return nil
}

// DeleteSubvolume deletes the subvolume name below dirfd with everything
// in it (read-only or not; the space is freed by the kernel in the
// background). It fails on a subvolume holding another one.
func DeleteSubvolume(dirfd int, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	var a volArgs
	copy(a.name[:], name)
	if err := ioctl(dirfd, iocSnapDestroy, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("deleting subvolume %s: %w", name, err)
	}
	return nil
}

// RemoveAll removes path, deleting it as a subvolume if it is one (or
// holds ones at its first level), else as os.RemoveAll does. A missing
// path is not an error.
func RemoveAll(path string) error {
	parent, err := unix.Open(filepath.Dir(path), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	name := filepath.Base(path)
	if IsSubvolume(parent, name) {
		if err := DeleteSubvolume(parent, name); err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
	}
	if ents, err := os.ReadDir(path); err == nil {
		if dfd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			for _, e := range ents {
				if e.IsDir() && IsSubvolume(dfd, e.Name()) {
					_ = DeleteSubvolume(dfd, e.Name())
				}
			}
			unix.Close(dfd)
		}
	}
	return os.RemoveAll(path)
}

// SubvolumeID returns the id of the subvolume fd is in.
func SubvolumeID(fd int) (uint64, error) {
	a := inoLookupArgs{objectid: firstFreeObjectID}
	if err := ioctl(fd, iocInoLookup, unsafe.Pointer(&a)); err != nil {
		return 0, fmt.Errorf("looking up subvolume id: %w", err)
	}
	return a.treeid, nil
}

// EnableSimpleQuota turns on simple quotas (squota: every extent is
// charged to the subvolume that wrote it, for its lifetime) on the
// filesystem of fd; already on is not an error.
func EnableSimpleQuota(fd int) error {
	a := quotaCtlArgs{cmd: quotaCtlEnableSimple}
	if err := ioctl(fd, iocQuotaCtl, unsafe.Pointer(&a)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("enabling simple quotas: %w", err)
	}
	return nil
}

// Limit caps the bytes the subvolume whose root is fd may hold (writes
// past it fail with EDQUOT); quotas must be enabled.
func Limit(fd int, bytes int64) error {
	a := qgroupLimitArgs{flags: qgroupLimitMaxRfer | qgroupLimitMaxExcl, maxRfer: uint64(bytes), maxExcl: uint64(bytes)}
	if err := ioctl(fd, iocQgroupLimit, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("limiting subvolume: %w", err)
	}
	return nil
}

// Usage returns the bytes charged to the subvolume fd is in, read from
// its qgroup in sysfs (quotas must be enabled).
func Usage(fd int) (int64, error) {
	id, err := SubvolumeID(fd)
	if err != nil {
		return 0, err
	}
	var fi fsInfoArgs
	if err := ioctl(fd, iocFSInfo, unsafe.Pointer(&fi)); err != nil {
		return 0, fmt.Errorf("reading filesystem id: %w", err)
	}
	u := fi.fsid
	uuid := fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	b, err := os.ReadFile(filepath.Join("/sys/fs/btrfs", uuid, "qgroups", "0_"+strconv.FormatUint(id, 10), "referenced"))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
}

// Mkfs formats the image file img as btrfs (mkfs.btrfs from
// btrfs-progs).
func Mkfs(ctx context.Context, img string) error {
	out, err := exec.CommandContext(ctx, "mkfs.btrfs", "-q", img).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.btrfs %s: %w: %s", img, err, bytes.TrimSpace(out))
	}
	return nil
}

// MountImage makes dir a mount of a btrfs filesystem stored in the image
// file img (nosuid, nodev, noatime, through a loop device): an existing
// btrfs mount at dir is kept, a missing image is made sparse, size bytes
// large, and formatted. The mount outlives the process (a later start
// finds it in place).
func MountImage(ctx context.Context, img, dir string, size int64) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if mounted, err := isMountPoint(dir); err != nil {
		return err
	} else if mounted {
		if ok, err := IsBtrfs(dir); err != nil || !ok {
			return fmt.Errorf("%s is a mount point but not btrfs: %w", dir, ErrNotBtrfs)
		}
		return nil
	}
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		if size <= 0 {
			return fmt.Errorf("creating %s: a size is required", img)
		}
		tmp := img + ".tmp"
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return fmt.Errorf("creating %s: %w", img, err)
		}
		err = f.Truncate(size)
		f.Close()
		if err == nil {
			err = Mkfs(ctx, tmp)
		}
		if err == nil {
			err = os.Rename(tmp, img)
		}
		if err != nil {
			os.Remove(tmp)
			return fmt.Errorf("creating %s: %w", img, err)
		}
	} else if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "mount", "-t", "btrfs", "-o", "loop,nosuid,nodev,noatime", img, dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mounting %s on %s: %w: %s", img, dir, err, bytes.TrimSpace(out))
	}
	return nil
}

// isMountPoint tells whether path is the root of a mount.
func isMountPoint(path string) (bool, error) {
	var st, pst unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, err
	}
	if err := unix.Lstat(filepath.Join(path, ".."), &pst); err != nil {
		return false, err
	}
	if st.Dev != pst.Dev {
		return true, nil
	}
	// A bind of a directory of the same filesystem: ask statx.
	var sx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &sx); err != nil {
		return false, err
	}
	return sx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && sx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
}
