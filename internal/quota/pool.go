package quota

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/quiet"
)

// The pool keeps filesystems of the default size formatted and mounted in
// advance, and retires removed ones in the background, so that neither
// mkfs, mount nor unmount (tens of milliseconds each on a loop device) is
// on a sandbox's create or kill path.
//
// Ready filesystems live at <MountDir>/.pool/<k> (image <ImageDir>/.pool-<k>.img),
// retired ones at <MountDir>/.trash/<k> (image <ImageDir>/.trash-<k>.img).
// Neither ever holds a sandbox that is alive: Open destroys both, which is
// also how a crash's leftovers are removed. A ready filesystem is handed to
// NewDir by moving its mount (move_mount, microseconds) and renaming its
// image; RemoveDir moves it to the trash the same way.
type pool struct {
	f     *FS
	size  int64
	want  int
	ready chan string // keys of ready filesystems under .pool

	wake  chan struct{}
	trash chan string // keys under .trash to destroy
	// vacated holds mount points under .pool whose filesystem was taken:
	// removing a directory that was a mount point waits for the host's
	// mount lock, so the background worker does it, not take.
	vacated chan string

	takes quiet.Events // NewDir's takes of ready filesystems

	stop chan struct{}
	wg   sync.WaitGroup
}

// A take after a quiet spell (package quiet) belongs to a create that is
// usually followed at once by its sandbox's first command: making its
// replacement (a copy of the formatted image, a loop device, a mount:
// milliseconds of CPU and the kernel's work after them) would run beside
// both, on a small machine slowing them. It starts refillDefer later,
// unless no filesystem is left ready. Takes closer together start it at
// once. refillDefer is a variable for tests.
var refillDefer = 100 * time.Millisecond

const (
	poolDir  = ".pool"
	trashDir = ".trash"
)

func (f *FS) poolMount(k string) string  { return filepath.Join(f.mountDir, poolDir, k) }
func (f *FS) poolImage(k string) string  { return filepath.Join(f.imageDir, ".pool-"+k+imageSuffix) }
func (f *FS) trashMount(k string) string { return filepath.Join(f.mountDir, trashDir, k) }
func (f *FS) trashImage(k string) string { return filepath.Join(f.imageDir, ".trash-"+k+imageSuffix) }

// startPool unmounts what an earlier run left mounted at MountDir (see
// Open), destroys what it left in the pool and the trash, makes MountDir a
// private mount of its own (moves need a private parent, and sandbox
// filesystems need not propagate anywhere) and starts the workers.
func (f *FS) startPool(ctx context.Context, want int, size int64) error {
	if err := f.resetMounts(); err != nil {
		return err
	}
	if err := makePrivateMount(f.mountDir); err != nil {
		return err
	}
	for _, d := range []string{poolDir, trashDir} {
		p := filepath.Join(f.mountDir, d)
		ents, _ := os.ReadDir(p)
		for _, e := range ents {
			f.destroy(filepath.Join(p, e.Name()), "")
		}
		if err := os.MkdirAll(p, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", p, err)
		}
	}
	for _, pat := range []string{".pool-*", ".trash-*"} { // images and their temporary names
		left, _ := filepath.Glob(filepath.Join(f.imageDir, pat))
		for _, img := range left {
			os.Remove(img)
		}
	}
	p := &pool{
		f: f, size: size, want: want,
		ready:   make(chan string, want),
		wake:    make(chan struct{}, 1),
		trash:   make(chan string, 1024),
		vacated: make(chan string, 1024),
		stop:    make(chan struct{}),
	}
	f.pool = p
	p.wg.Add(2)
	go p.fill(context.WithoutCancel(ctx))
	go p.empty()
	return nil
}

// makePrivateMount bind-mounts dir onto itself if it is not a mount point
// yet, and makes it private.
func makePrivateMount(dir string) error {
	mounted, err := isMountPoint(dir)
	if err != nil {
		return err
	}
	if !mounted {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting %s: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making %s private: %w", dir, err)
	}
	return nil
}

// fill keeps want filesystems ready.
func (p *pool) fill(ctx context.Context) {
	defer p.wg.Done()
	for {
		for len(p.ready) < p.want {
			k := randomSuffix()
			if err := p.make(ctx, k); err != nil {
				p.f.log.Warn("preparing a sandbox disk in advance", "err", err)
				break
			}
			p.ready <- k
		}
		select {
		case <-p.stop:
			return
		case <-p.wake:
		case <-time.After(10 * time.Second): // retry after failures
		}
	}
}

func (p *pool) make(ctx context.Context, k string) error {
	img, mnt := p.f.poolImage(k), p.f.poolMount(k)
	if err := p.f.createImage(ctx, img, p.size); err != nil {
		return err
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		os.Remove(img)
		return err
	}
	if err := mountImage(img, mnt, false); err != nil {
		os.Remove(mnt)
		os.Remove(img)
		return err
	}
	if err := prepareRoot(mnt, p.f.dirs); err != nil {
		p.f.destroy(mnt, img)
		return err
	}
	return nil
}

// take moves a ready filesystem to name, or reports false when none is
// ready (or limit is not the pooled size).
func (p *pool) take(name string, limit int64) (string, bool, error) {
	if p == nil || limit != p.size {
		return "", false, nil
	}
	var k string
	select {
	case k = <-p.ready:
	default:
		p.nudge()
		return "", false, nil
	}
	if p.takes.Note() && len(p.ready) > 0 {
		time.AfterFunc(refillDefer, p.nudge)
	} else {
		p.nudge()
	}
	mnt := p.f.Path(name)
	if err := os.Rename(p.f.poolImage(k), p.f.image(name)); err != nil {
		p.f.destroy(p.f.poolMount(k), p.f.poolImage(k))
		return "", false, fmt.Errorf("taking a prepared disk: %w", err)
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		p.f.destroy(p.f.poolMount(k), p.f.image(name))
		return "", false, fmt.Errorf("taking a prepared disk: %w", err)
	}
	if err := unix.MoveMount(unix.AT_FDCWD, p.f.poolMount(k), unix.AT_FDCWD, mnt, 0); err != nil {
		p.f.destroy(p.f.poolMount(k), p.f.image(name))
		os.Remove(mnt)
		return "", false, fmt.Errorf("taking a prepared disk: %w", err)
	}
	select {
	case p.vacated <- p.f.poolMount(k):
	default:
		os.Remove(p.f.poolMount(k)) // queue full: do it now
	}
	return mnt, true, nil
}

func (p *pool) nudge() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// retire moves name's filesystem to the trash for the background worker;
// false means it was not mounted (the caller removes it in place).
func (p *pool) retire(name string) (bool, error) {
	if p == nil {
		return false, nil
	}
	mnt := p.f.Path(name)
	mounted, err := isMountPoint(mnt)
	if err != nil || !mounted {
		return false, err
	}
	k := randomSuffix()
	if err := os.Mkdir(p.f.trashMount(k), 0o700); err != nil {
		return false, err
	}
	if err := unix.MoveMount(unix.AT_FDCWD, mnt, unix.AT_FDCWD, p.f.trashMount(k), 0); err != nil {
		os.Remove(p.f.trashMount(k))
		return false, fmt.Errorf("retiring %s: %w", mnt, err)
	}
	if err := os.Rename(p.f.image(name), p.f.trashImage(k)); err != nil && !errors.Is(err, os.ErrNotExist) {
		p.f.log.Warn("retiring disk image", "err", err)
	}
	if err := os.Remove(mnt); err != nil && !errors.Is(err, os.ErrNotExist) {
		return true, err
	}
	select {
	case p.trash <- k:
	default:
		p.f.destroy(p.f.trashMount(k), p.f.trashImage(k)) // queue full: do it now
	}
	return true, nil
}

// empty destroys retired filesystems.
func (p *pool) empty() {
	defer p.wg.Done()
	for {
		select {
		case k := <-p.trash:
			p.f.destroy(p.f.trashMount(k), p.f.trashImage(k))
		case d := <-p.vacated:
			os.Remove(d)
		case <-p.stop:
			for {
				select {
				case k := <-p.trash:
					p.f.destroy(p.f.trashMount(k), p.f.trashImage(k))
				case d := <-p.vacated:
					os.Remove(d)
				default:
					return
				}
			}
		}
	}
}

// destroy unmounts mnt (lazily if busy), removes it and the image img.
func (f *FS) destroy(mnt, img string) {
	for range 8 {
		mounted, err := isMountPoint(mnt)
		if err != nil || !mounted {
			break
		}
		if err := unix.Unmount(mnt, 0); err != nil {
			if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
				f.log.Warn("unmounting retired disk", "dir", mnt, "err", err)
				break
			}
		}
	}
	os.RemoveAll(mnt)
	if img != "" {
		os.Remove(img)
	}
}

// prepareRoot gives a fresh filesystem's root the state NewDir promises,
// with dirs (Options.Dirs) made in it.
func prepareRoot(mnt string, dirs []string) error {
	if err := os.Chmod(mnt, 0o755); err != nil {
		return fmt.Errorf("chmod %s: %w", mnt, err)
	}
	if err := os.Remove(filepath.Join(mnt, "lost+found")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing lost+found: %w", err)
	}
	for _, d := range dirs {
		// Below mnt, a fresh filesystem with no link in it yet: MkdirAll
		// follows no symlink of anyone's.
		if err := os.MkdirAll(filepath.Join(mnt, d), 0o755); err != nil {
			return fmt.Errorf("preparing %s: %w", d, err)
		}
	}
	return nil
}

// Close stops the pool's workers, destroying the ready filesystems and
// what is queued in the trash. Directories made with NewDir stay.
func (f *FS) Close() error {
	f.closeOnce.Do(func() {
		f.removeSeeds()
		if f.pool == nil {
			return
		}
		close(f.pool.stop)
		f.pool.wg.Wait()
		for {
			select {
			case k := <-f.pool.ready:
				f.destroy(f.poolMount(k), f.poolImage(k))
				continue
			default:
			}
			break
		}
		// With no directory left mounted below it, the private mount of
		// MountDir goes too, so a stopped daemon leaves no mount behind.
		if names, err := f.Dirs(); err == nil && len(names) == 0 {
			if err := unmountAll(f.mountDir); err != nil {
				f.log.Warn("unmounting the disk directory", "err", err)
			}
		}
	})
	return nil
}

// Destroy closes f and removes everything it holds: every directory, the
// pool and the trash, and the private mount of MountDir. It is for
// one-off users (a `fence run`); the directories must be unused.
func (f *FS) Destroy() error {
	f.Close()
	var errs []error
	names, err := f.Dirs()
	if err != nil {
		errs = append(errs, err)
	}
	for _, n := range names {
		if err := f.cleanup(n); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range []string{poolDir, trashDir} {
		p := filepath.Join(f.mountDir, d)
		ents, _ := os.ReadDir(p)
		for _, e := range ents {
			f.destroy(filepath.Join(p, e.Name()), "")
		}
		os.Remove(p)
	}
	for _, pat := range []string{".pool-*", ".trash-*"} { // images and their temporary names
		left, _ := filepath.Glob(filepath.Join(f.imageDir, pat))
		for _, img := range left {
			os.Remove(img)
		}
	}
	if err := unmountAll(f.mountDir); err != nil {
		errs = append(errs, err)
	}
	f.releaseOrphanLoops()
	for _, d := range []string{f.mountDir, f.imageDir} {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
