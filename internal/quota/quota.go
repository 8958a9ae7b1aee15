package quota

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/api"
)

// ErrUnsupported is wrapped by the errors of Open and NewDir when this host
// cannot provide kernel-enforced disk limits (no loop devices, no ext4, no
// mkfs.ext4, no privilege). A caller may then fall back to unlimited
// writable layers.
var ErrUnsupported = errors.New("disk limits unsupported on this host")

const (
	// DefaultLimit is the limit NewDir applies when given 0.
	DefaultLimit int64 = 1 << 30
	// MinLimit is the smallest limit NewDir accepts.
	MinLimit int64 = 4 << 20

	imageSuffix = ".img"
	tmpInfix    = ".tmp-"
	mkfsTimeout = 10 * time.Second

	ext4SuperMagic = 0xef53
)

// Mount flags and options of every directory's filesystem. discard returns
// freed space to the host file; noinit_itable stops the kernel zeroing
// inode tables that in a sparse image read as zero already; nobarrier
// keeps the filesystem from flushing the host's disk cache: a sandbox's
// disk does not outlive a crash (the next start removes it), so neither
// its fsyncs nor its unmount (every sandbox's teardown) need to reach the
// host's platters, and a sandbox calling fsync in a loop cannot make the
// host's disk flush in a loop.
const (
	mountFlags   = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME
	mountOptions = "discard,noinit_itable,nobarrier"
	// durableMountOptions are Options.Durable's: barriers on.
	durableMountOptions = "discard,noinit_itable"
)

// Options configure an FS.
type Options struct {
	// ImageDir holds the image files. Created if missing. Required.
	ImageDir string
	// MountDir holds the mount points. Created if missing. Required. It
	// should not be inside ImageDir or vice versa.
	MountDir string
	// Logger receives events. If nil, logs are discarded.
	Logger *slog.Logger
	// PoolSize is how many filesystems of DefaultLimit to keep formatted
	// and mounted in advance; it also moves unmounting off RemoveDir's
	// path. Zero disables the pool: every NewDir formats and mounts, every
	// RemoveDir unmounts, synchronously.
	PoolSize int
	// PoolLimit is the limit of the pooled filesystems; zero means
	// DefaultLimit. NewDir with another limit formats synchronously.
	PoolLimit int64
	// Durable makes filesystems whose data outlives a crash (volumes):
	// formatted with a journal, mounted with write barriers, so an fsync
	// inside reaches the host's disk and a crash leaves a filesystem the
	// journal replays at its next mount. Remount mounts one again after
	// its mount went (a reboot). Without it, a directory's data lasts as
	// long as its sandbox (no journal, no barriers).
	Durable bool
	// Dirs are directories (relative, clean, below the root) every new
	// filesystem holds when NewDir returns it, mode 0755 and owned by
	// root: made when the filesystem is prepared, for a pooled one ahead
	// of NewDir, so that the first writes to a fresh filesystem (which
	// read its metadata through the loop device) are not the caller's.
	Dirs []string
}

// FS makes and removes size-limited directories. Its methods are safe for
// concurrent use with different names; calls with the same name must not
// overlap (the caller owns each name).
type FS struct {
	imageDir string
	mountDir string
	mkfs     string
	log      *slog.Logger
	durable  bool
	dirs     []string // Options.Dirs

	pool      *pool // nil without Options.PoolSize
	closeOnce sync.Once

	seedMu sync.Mutex
	seeds  map[int64]string // size → formatted image new images are copied from

	// Temporary images Dirs found (left by a crash while an image was
	// made), by directory name, for RemoveDir: a removal does not list the
	// image directory, which holds every sandbox's image.
	tempMu sync.Mutex
	temps  map[string][]string
}

// Open checks that this host can make limited directories and returns an FS
// over opts' directories, which may be reached through symlinks: the FS
// works on them as the kernel resolves them. Existing directories (of a
// previous run) stay mounted and usable, and Dirs lists them, except where
// Open resets MountDir: with a pool (the daemon's), or when more than one
// mount is stacked there (which hides what is mounted below the top one).
// The reset unmounts every mount at MountDir with everything below it and
// releases the loop devices whose image under ImageDir is gone (see
// resetMounts); Dirs still lists the earlier run's directories, unmounted,
// for RemoveDir.
func Open(ctx context.Context, opts Options) (*FS, error) {
	if opts.ImageDir == "" || opts.MountDir == "" {
		return nil, fmt.Errorf("quota: ImageDir and MountDir are required: %w", api.ErrInvalidArgument)
	}
	for _, d := range opts.Dirs {
		if d == "" || filepath.IsAbs(d) || filepath.Clean(d) != d || d == "." || d == ".." || strings.HasPrefix(d, "../") {
			return nil, fmt.Errorf("quota: directory %q: want a clean relative path below the root: %w", d, api.ErrInvalidArgument)
		}
	}
	f := &FS{log: opts.Logger, durable: opts.Durable, dirs: slices.Clone(opts.Dirs)}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if f.imageDir, err = filepath.Abs(opts.ImageDir); err != nil {
		return nil, fmt.Errorf("resolving image dir: %w", err)
	}
	if f.mountDir, err = filepath.Abs(opts.MountDir); err != nil {
		return nil, fmt.Errorf("resolving mount dir: %w", err)
	}
	for _, d := range []*string{&f.imageDir, &f.mountDir} {
		if err := os.MkdirAll(*d, 0o700); err != nil {
			return nil, fmt.Errorf("creating %s: %w", *d, err)
		}
		// The kernel's spelling of the directory, symlinks followed: the
		// one mountinfo and the loop devices' backing files show, and
		// the one every mount and unmount here goes through.
		if *d, err = filepath.EvalSymlinks(*d); err != nil {
			return nil, fmt.Errorf("resolving %s: %w", *d, err)
		}
	}
	if f.mkfs, err = exec.LookPath("mkfs.ext4"); err != nil {
		return nil, fmt.Errorf("%w: mkfs.ext4 not found (apt-get install e2fsprogs): %w", ErrUnsupported, err)
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return nil, fmt.Errorf("%w: no loop devices: %w", ErrUnsupported, err)
	}
	// Mounts stacked at MountDir hide the directories mounted below
	// them from every path: only unmounting them all reaches those. (A
	// pool starts with this anyway, see startPool.)
	if opts.PoolSize == 0 {
		if n, err := countMounts(f.mountDir); err != nil {
			return nil, err
		} else if n > 1 {
			if err := f.resetMounts(); err != nil {
				return nil, err
			}
		}
	}
	// Seeds are made anew by each FS (see createImage).
	left, _ := filepath.Glob(filepath.Join(f.imageDir, seedPrefix+"*"))
	for _, img := range left {
		os.Remove(img)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if opts.PoolSize > 0 {
		limit := opts.PoolLimit
		if limit == 0 {
			limit = DefaultLimit
		}
		if err := f.startPool(ctx, opts.PoolSize, limit); err != nil {
			return nil, fmt.Errorf("starting disk pool: %w", err)
		}
	}
	return f, nil
}

// validateName accepts a single, non-hidden path element.
func validateName(name string) error {
	if name == "" || name[0] == '.' || strings.ContainsAny(name, "/\x00") || len(name) > 200 {
		return fmt.Errorf("invalid quota dir name %q: %w", name, api.ErrInvalidArgument)
	}
	return nil
}

func (f *FS) image(name string) string { return filepath.Join(f.imageDir, name+imageSuffix) }

// Path returns the mount point of the named directory (whether or not it
// exists).
func (f *FS) Path(name string) string { return filepath.Join(f.mountDir, name) }

// NewDir creates the directory name limited to limitBytes (DefaultLimit if
// 0) and returns its path, <MountDir>/<name>: the root of a fresh ext4
// filesystem owned by root with mode 0755. If name exists, the error wraps
// fs.ErrExist. On any error nothing is left behind.
func (f *FS) NewDir(ctx context.Context, name string, limitBytes int64) (path string, err error) {
	if err := validateName(name); err != nil {
		return "", err
	}
	if limitBytes == 0 {
		limitBytes = DefaultLimit
	}
	if limitBytes < MinLimit {
		return "", fmt.Errorf("disk limit %d is below %d: %w", limitBytes, MinLimit, api.ErrInvalidArgument)
	}
	image, mnt := f.image(name), f.Path(name)
	if _, err := os.Lstat(image); err == nil {
		return "", fmt.Errorf("quota dir %s: %w", name, fs.ErrExist)
	}
	if p, ok, err := f.pool.take(name, limitBytes); ok || err != nil {
		return p, err
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("quota dir %s: %w", name, fs.ErrExist)
		}
		return "", fmt.Errorf("creating mount point: %w", err)
	}
	defer func() {
		if err != nil {
			f.cleanup(name)
		}
	}()
	if err := f.createImage(ctx, image, limitBytes); err != nil {
		return "", err
	}
	if err := mountImage(image, mnt, f.durable); err != nil {
		return "", err
	}
	// lost+found is only clutter in an overlay upper.
	if err := prepareRoot(mnt, f.dirs); err != nil {
		return "", err
	}
	return mnt, nil
}

// createImage makes a sparse ext4 image of size bytes at image, through a
// temporary name. It copies the image's allocated blocks from a seed: one
// image of that size formatted once by mkfs.ext4 (under ImageDir, named
// .seed-SIZE.img, made at the first use of a size and removed by Open and
// Close). A formatted, empty image of 1 GiB holds about 150 KiB of
// metadata in a few extents; copying them costs a fraction of a
// millisecond, where running mkfs.ext4 costs tens of milliseconds of CPU.
// The images of one FS therefore share their filesystem UUID, which
// nothing here or in a sandbox relies on.
func (f *FS) createImage(ctx context.Context, image string, size int64) error {
	tmp := image + tmpInfix + randomSuffix()
	for retry := true; ; retry = false {
		seed, err := f.seed(ctx, size)
		if err != nil {
			return err
		}
		err = copyImage(tmp, seed, size)
		if err == nil {
			break
		}
		os.Remove(tmp)
		if !retry || !errors.Is(err, errNoSeed) {
			return fmt.Errorf("creating image: %w", err)
		}
		// The seed went (removed by hand): it is formatted again.
		f.forgetSeed(size)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, image, unix.RENAME_NOREPLACE); err != nil {
		os.Remove(tmp)
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("installing image: %w", fs.ErrExist)
		}
		return fmt.Errorf("installing image: %w", err)
	}
	return nil
}

// seedPrefix names the seed images in ImageDir.
const seedPrefix = ".seed-"

// seed returns the formatted image of size bytes that new images are
// copied from, formatting it first if this FS has none.
func (f *FS) seed(ctx context.Context, size int64) (string, error) {
	f.seedMu.Lock()
	defer f.seedMu.Unlock()
	if p, ok := f.seeds[size]; ok {
		return p, nil
	}
	p := filepath.Join(f.imageDir, seedPrefix+strconv.FormatInt(size, 10)+imageSuffix)
	tmp := p + tmpInfix + randomSuffix()
	if err := f.mkfsImage(ctx, tmp, size); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("installing seed image: %w", err)
	}
	if f.seeds == nil {
		f.seeds = map[int64]string{}
	}
	f.seeds[size] = p
	return p, nil
}

// errNoSeed is copyImage's error when the seed image is gone.
var errNoSeed = errors.New("the seed image is gone")

// forgetSeed drops the seed of size from the cache; the next seed call
// formats it again.
func (f *FS) forgetSeed(size int64) {
	f.seedMu.Lock()
	defer f.seedMu.Unlock()
	delete(f.seeds, size)
}

// removeSeeds deletes the seed images; the next createImage formats anew.
func (f *FS) removeSeeds() {
	f.seedMu.Lock()
	defer f.seedMu.Unlock()
	for size, p := range f.seeds {
		os.Remove(p)
		delete(f.seeds, size)
	}
}

// mkfsImage formats a new sparse image of size bytes at path.
func (f *FS) mkfsImage(ctx context.Context, path string, size int64) error {
	fd, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating image: %w", err)
	}
	err = fd.Truncate(size)
	if cerr := fd.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("sizing image: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, mkfsTimeout)
	defer cancel()
	features, ext := "^has_journal,^resize_inode", "root_owner=0:0,lazy_itable_init=1,nodiscard"
	if f.durable {
		// The journal of a sparse image reads as zeros already: not
		// writing them keeps it a hole, out of every copy of the seed.
		features, ext = "^resize_inode", ext+",lazy_journal_init=1"
	}
	cmd := exec.CommandContext(ctx, f.mkfs, "-q", "-F",
		"-b", "4096", // the loop device's logical block size
		"-i", "8192", // one inode per 8 KiB
		"-m", "0", // no blocks reserved for root
		// No journal; no blocks reserved for growing the filesystem
		// online (resize_inode: 127 group descriptor blocks at 1 GiB,
		// three quarters of the formatted image, copied at every create
		// and never used, since a sandbox's disk never grows).
		"-O", features,
		"-E", ext,
		path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 2 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(path)
		return fmt.Errorf("running mkfs.ext4: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copyImage makes dst (which must not exist) a sparse copy of the image
// src, size bytes long: only src's allocated extents are copied, in the
// kernel where it can.
func copyImage(dst, src string, size int64) error {
	in, err := os.Open(src)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", errNoSeed, err)
	}
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = copyExtents(out, in, size)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

func copyExtents(out, in *os.File, size int64) error {
	if err := out.Truncate(size); err != nil {
		return err
	}
	ifd, ofd := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("finding data in the seed image: %w", err)
		}
		hole, err := unix.Seek(ifd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("finding a hole in the seed image: %w", err)
		}
		hole = min(hole, size)
		if err := copyRange(out, in, ofd, ifd, data, hole); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copyRange copies [from, to) of in to the same offsets of out.
func copyRange(out, in *os.File, ofd, ifd int, from, to int64) error {
	roff, woff := from, from
	for roff < to {
		n, err := unix.CopyFileRange(ifd, &roff, ofd, &woff, int(to-roff), 0)
		if err == nil && n > 0 {
			continue
		}
		if err == nil || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			// No in-kernel copy here: copy through a buffer.
			_, err = io.Copy(io.NewOffsetWriter(out, roff), io.NewSectionReader(in, roff, to-roff))
			return err
		}
		return fmt.Errorf("copying the seed image: %w", err)
	}
	return nil
}

// mountImage attaches image to a free loop device and mounts it at mnt;
// durable keeps write barriers.
func mountImage(image, mnt string, durable bool) error {
	dev, loop, err := attachLoop(image)
	if err != nil {
		return err
	}
	// After the mount, the mount alone holds the device; with
	// LO_FLAGS_AUTOCLEAR it detaches when that ends (or now, if the mount
	// failed).
	defer loop.Close()
	opts := mountOptions
	if durable {
		opts = durableMountOptions
	}
	if err := unix.Mount(dev, mnt, "ext4", mountFlags, opts); err != nil {
		err = fmt.Errorf("mounting %s (%s) at %s: %w", image, dev, mnt, err)
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EACCES) {
			err = fmt.Errorf("%w: %w", ErrUnsupported, err)
		}
		return err
	}
	return nil
}

// Remount mounts the existing directory name again if it is not mounted
// (its mount went with a reboot, or a reset of MountDir) and returns its
// path; a mounted one is left as it is. A name without an image wraps
// api.ErrNotFound. With Options.Durable the journal is replayed by the
// mount.
func (f *FS) Remount(name string) (string, error) {
	if err := validateName(name); err != nil {
		return "", err
	}
	image, mnt := f.image(name), f.Path(name)
	if _, err := os.Lstat(image); err != nil {
		return "", fmt.Errorf("quota dir %s: %w: %w", name, api.ErrNotFound, err)
	}
	if mounted, err := isMountPoint(mnt); err != nil {
		return "", err
	} else if mounted {
		return mnt, nil
	}
	if err := os.Mkdir(mnt, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("creating mount point: %w", err)
	}
	if err := mountImage(image, mnt, f.durable); err != nil {
		return "", err
	}
	return mnt, nil
}

// Unmount unmounts the directory name, keeping its image for Remount; a
// busy one is detached lazily. Not mounted is no error.
func (f *FS) Unmount(name string) error {
	if err := validateName(name); err != nil {
		return err
	}
	mnt := f.Path(name)
	mounted, err := isMountPoint(mnt)
	if err != nil || !mounted {
		return err
	}
	err = unix.Unmount(mnt, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(mnt, unix.MNT_DETACH)
	}
	if err != nil {
		return fmt.Errorf("unmounting %s: %w", mnt, err)
	}
	return nil
}

// RemoveDir unmounts and deletes the named directory and its image. It is
// idempotent, and also removes a half-made directory or what a crash left.
// If the filesystem is still busy (a sandbox's overlay on it), it is
// detached lazily: the name is free at once and the space is returned when
// the last user goes.
func (f *FS) RemoveDir(name string) error {
	if err := validateName(name); err != nil {
		return err
	}
	return f.cleanup(name)
}

func (f *FS) cleanup(name string) error {
	mnt := f.Path(name)
	if moved, err := f.pool.retire(name); moved || err != nil {
		return err
	}
	var errs []error
	for range 8 { // stacked mounts, if any
		mounted, err := isMountPoint(mnt)
		if err != nil {
			errs = append(errs, err)
			break
		}
		if !mounted {
			break
		}
		err = unix.Unmount(mnt, 0)
		if errors.Is(err, unix.EBUSY) {
			f.log.Warn("quota dir busy, detaching lazily", "dir", mnt)
			err = unix.Unmount(mnt, unix.MNT_DETACH)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mnt, err))
			break
		}
	}
	if len(errs) == 0 {
		// Not mounted any more: whatever is left is an empty mount point,
		// or files written into it when it was not mounted.
		if err := os.RemoveAll(mnt); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", mnt, err))
		}
	}
	image := f.image(name)
	f.tempMu.Lock()
	tmps := f.temps[name]
	delete(f.temps, name)
	f.tempMu.Unlock()
	for _, p := range append(tmps, image) {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// Dirs returns the names of every directory that exists in whole or in
// part (image, temporary image or mount point), sorted. After a crash, the
// caller removes those no sandbox owns with RemoveDir, which removes the
// temporary images Dirs found too.
func (f *FS) Dirs() ([]string, error) {
	var names []string
	images, err := os.ReadDir(f.imageDir)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", f.imageDir, err)
	}
	temps := map[string][]string{}
	for _, e := range images {
		n := e.Name()
		if i := strings.Index(n, imageSuffix+tmpInfix); i > 0 {
			temps[n[:i]] = append(temps[n[:i]], filepath.Join(f.imageDir, n))
			n = n[:i]
		} else if base, ok := strings.CutSuffix(n, imageSuffix); ok {
			n = base
		} else {
			continue
		}
		if validateName(n) == nil {
			names = append(names, n)
		}
	}
	mounts, err := os.ReadDir(f.mountDir)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", f.mountDir, err)
	}
	for _, e := range mounts {
		if validateName(e.Name()) == nil {
			names = append(names, e.Name())
		}
	}
	f.tempMu.Lock()
	f.temps = temps
	f.tempMu.Unlock()
	slices.Sort(names)
	return slices.Compact(names), nil
}

// Usage is the space and inodes a directory uses, and their limits.
type Usage struct {
	Bytes       int64
	LimitBytes  int64 // the filesystem's size less its metadata
	Inodes      int64
	LimitInodes int64
}

// Usage reads the current use of the named directory. A directory that is
// not mounted wraps api.ErrNotFound.
func (f *FS) Usage(name string) (Usage, error) {
	if err := validateName(name); err != nil {
		return Usage{}, err
	}
	mnt := f.Path(name)
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return Usage{}, fmt.Errorf("quota dir %s: %w", name, api.ErrNotFound)
		}
		return Usage{}, fmt.Errorf("statfs %s: %w", mnt, err)
	}
	if st.Type != ext4SuperMagic {
		return Usage{}, fmt.Errorf("quota dir %s is not mounted: %w", name, api.ErrNotFound)
	}
	if mounted, err := isMountPoint(mnt); err != nil || !mounted {
		return Usage{}, fmt.Errorf("quota dir %s is not mounted: %w", name, api.ErrNotFound)
	}
	return usageOf(&st), nil
}

// UsageFD reads the use of the filesystem whose root fd names: a
// directory's writable layer once its host mount is detached and only the
// sandbox's mount namespace and this descriptor keep it.
func UsageFD(fd int) (Usage, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return Usage{}, fmt.Errorf("statfs: %w", err)
	}
	if st.Type != ext4SuperMagic {
		return Usage{}, fmt.Errorf("not a writable layer (filesystem type %#x): %w", st.Type, api.ErrNotFound)
	}
	return usageOf(&st), nil
}

// usageOf reads a writable layer's use from its statfs.
func usageOf(st *unix.Statfs_t) Usage {
	bs := st.Bsize
	return Usage{
		Bytes:       int64(st.Blocks-st.Bfree) * bs,
		LimitBytes:  int64(st.Blocks) * bs,
		Inodes:      int64(st.Files - st.Ffree),
		LimitInodes: int64(st.Files),
	}
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
