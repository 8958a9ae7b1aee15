package quota

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/testutil"
)

func openTest(t *testing.T) *FS {
	t.Helper()
	dir := t.TempDir()
	f, err := Open(t.Context(), Options{
		ImageDir: filepath.Join(dir, "images"),
		MountDir: filepath.Join(dir, "mnt"),
		Logger:   slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return f
}

// newDir makes a limited dir and removes it when the test ends.
func newDir(t *testing.T, f *FS, name string, limit int64) string {
	t.Helper()
	p, err := f.NewDir(t.Context(), name, limit)
	if err != nil {
		t.Fatalf("NewDir(%s, %d) = %v", name, limit, err)
	}
	t.Cleanup(func() {
		if err := f.RemoveDir(name); err != nil {
			t.Errorf("RemoveDir(%s) = %v", name, err)
		}
	})
	return p
}

// fill writes 1 MiB chunks to path until an error or max bytes, and
// returns the bytes written and the error that stopped it.
func fill(t *testing.T, path string, max int64) (int64, error) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatalf("creating %s: %v", path, err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i) | 1
	}
	var n int64
	for n < max {
		w, err := f.Write(chunk)
		n += int64(w)
		if err != nil {
			return n, err
		}
	}
	return n, f.Sync()
}

func isFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// TestLimit proves that the kernel stops writes at a directory's limit,
// that directories are independent, and that RemoveDir frees everything,
// the loop device included. Root: loop devices and mount.
func TestLimit(t *testing.T) {
	testutil.RequireRoot(t)
	f := openTest(t)
	const limit = 10 << 20
	a := newDir(t, f, "a", limit)
	if want := filepath.Join(f.mountDir, "a"); a != want {
		t.Errorf("NewDir(a) = %q, want %q", a, want)
	}
	b := newDir(t, f, "b", limit)
	if _, err := f.NewDir(t.Context(), "a", limit); !errors.Is(err, fs.ErrExist) {
		t.Errorf("NewDir(a) twice = %v, want ErrExist", err)
	}

	m, err := findMount(a)
	if err != nil || m == nil || m.fstype != "ext4" || !strings.HasPrefix(m.source, "/dev/loop") {
		t.Fatalf("findMount(%s) = %+v, %v, want ext4 on a loop device", a, m, err)
	}
	// A sandbox's fsync, and its disk's unmount, must not flush the
	// host's disk cache.
	if !slices.Contains(strings.Split(m.superOptions, ","), "nobarrier") {
		t.Errorf("%s mounted with %q: want nobarrier", a, m.superOptions)
	}
	image := f.image("a")
	fi, err := os.Stat(image)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != limit {
		t.Errorf("image size = %d, want %d", fi.Size(), limit)
	}
	if backing, err := loopBackingFile(m.source); err != nil || backing != image {
		t.Errorf("loopBackingFile(%s) = %q, %v, want %q", m.source, backing, err, image)
	}

	if err := os.MkdirAll(filepath.Join(a, "sub", "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	n, err := fill(t, filepath.Join(a, "sub", "dir", "big"), 20<<20)
	if !isFull(err) {
		t.Fatalf("writing 20 MiB into a 10 MiB dir: wrote %d, err %v, want ENOSPC", n, err)
	}
	if n < limit*8/10 || n > limit {
		t.Errorf("writing into a 10 MiB dir stopped after %d bytes, want about %d", n, limit)
	}
	u, err := f.Usage("a")
	if err != nil {
		t.Fatalf("Usage(a) = %v", err)
	}
	if u.Bytes < n || u.LimitBytes > limit || u.LimitBytes < limit*8/10 || u.Inodes < 3 || u.LimitInodes != limit/8192 {
		t.Errorf("Usage(a) = %+v, want at least %d of about %d bytes, 3+ inodes of %d", u, n, limit, limit/8192)
	}

	// b is independent of a.
	if n, err := fill(t, filepath.Join(b, "f"), 5<<20); err != nil || n != 5<<20 {
		t.Errorf("writing 5 MiB into b = %d, %v, want 5 MiB, nil", n, err)
	}
	if u, err := f.Usage("b"); err != nil || u.Bytes < 5<<20 {
		t.Errorf("Usage(b) = %+v, %v, want 5 MiB used", u, err)
	}
	if dirs, err := f.Dirs(); err != nil || strings.Join(dirs, ",") != "a,b" {
		t.Errorf("Dirs() = %v, %v, want [a b]", dirs, err)
	}

	if err := f.RemoveDir("a"); err != nil {
		t.Fatalf("RemoveDir(a) = %v", err)
	}
	if err := f.RemoveDir("a"); err != nil {
		t.Errorf("RemoveDir(a) twice = %v, want nil", err)
	}
	for _, p := range []string{a, image} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Lstat(%s) after RemoveDir = %v, want ErrNotExist", p, err)
		}
	}
	if backing, err := loopBackingFile(m.source); err == nil {
		t.Errorf("loop device %s still bound to %s after RemoveDir", m.source, backing)
	}
	if _, err := f.Usage("a"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Usage(a) after RemoveDir = %v, want ErrNotFound", err)
	}
	if dirs, err := f.Dirs(); err != nil || strings.Join(dirs, ",") != "b" {
		t.Errorf("Dirs() = %v, %v, want [b]", dirs, err)
	}
}

// TestOverlayUpperLimited proves that an overlayfs whose upper and work
// dirs are inside a limited dir cannot write past the limit (the way
// sandboxes use it), and that RemoveDir copes with the overlay still
// mounted. Root: mounts.
func TestOverlayUpperLimited(t *testing.T) {
	testutil.RequireRoot(t)
	f := openTest(t)
	const limit = 10 << 20
	q := newDir(t, f, "sb1", limit)
	upper, work := filepath.Join(q, "upper"), filepath.Join(q, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	lower, merged := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(lower, "from-lower"), []byte("lower"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatalf("mounting overlay: %v", err)
	}
	overlayMounted := true
	t.Cleanup(func() {
		if overlayMounted {
			unix.Unmount(merged, unix.MNT_DETACH)
		}
	})

	// Copy-up and whiteouts work.
	if err := os.WriteFile(filepath.Join(merged, "from-lower"), []byte("changed"), 0o644); err != nil {
		t.Fatalf("copy-up: %v", err)
	}
	if err := os.Remove(filepath.Join(merged, "from-lower")); err != nil {
		t.Fatalf("whiteout: %v", err)
	}

	n, err := fill(t, filepath.Join(merged, "big"), 20<<20)
	if !isFull(err) {
		t.Fatalf("writing 20 MiB through the overlay: wrote %d, err %v, want ENOSPC", n, err)
	}
	if n > limit {
		t.Errorf("wrote %d bytes through the overlay, want at most %d", n, limit)
	}
	if u, err := f.Usage("sb1"); err != nil || u.Bytes < n {
		t.Errorf("Usage(sb1) = %+v, %v, want at least %d bytes", u, err, n)
	}
	if fi, err := os.Stat(filepath.Join(upper, "big")); err != nil || fi.Size() != n {
		t.Errorf("Stat(upper/big) = %v, %v, want %d bytes", fi, err, n)
	}

	// The overlay still holds the filesystem: RemoveDir detaches lazily.
	if err := f.RemoveDir("sb1"); err != nil {
		t.Fatalf("RemoveDir(sb1) with the overlay mounted = %v", err)
	}
	if _, err := os.Lstat(q); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Lstat(%s) after RemoveDir = %v, want ErrNotExist", q, err)
	}
	if err := unix.Unmount(merged, 0); err != nil {
		t.Errorf("unmounting overlay: %v", err)
	}
	overlayMounted = false
}

// TestCrashLeftovers checks that Dirs reports and RemoveDir cleans what a
// crash leaves: a temporary image, an image without a mount, and a mount
// that outlived its daemon. Root: mounts.
func TestCrashLeftovers(t *testing.T) {
	testutil.RequireRoot(t)
	f := openTest(t)
	if _, err := f.NewDir(t.Context(), "mounted", MinLimit); err != nil {
		t.Fatalf("NewDir(mounted) = %v", err)
	}
	if err := os.WriteFile(f.image("tmp")+tmpInfix+"abc", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.image("unmounted"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A daemon restart: a new FS over the same directories.
	f2, err := Open(t.Context(), Options{ImageDir: f.imageDir, MountDir: f.mountDir})
	if err != nil {
		t.Fatalf("Open again = %v", err)
	}
	if u, err := f2.Usage("mounted"); err != nil || u.LimitBytes == 0 {
		t.Errorf("Usage(mounted) after reopen = %+v, %v, want a limit", u, err)
	}
	dirs, err := f2.Dirs()
	if err != nil || strings.Join(dirs, ",") != "mounted,tmp,unmounted" {
		t.Fatalf("Dirs() = %v, %v, want [mounted tmp unmounted]", dirs, err)
	}
	for _, d := range dirs {
		if err := f2.RemoveDir(d); err != nil {
			t.Errorf("RemoveDir(%s) = %v", d, err)
		}
	}
	if dirs, err := f2.Dirs(); err != nil || len(dirs) != 0 {
		t.Errorf("Dirs() after RemoveDir = %v, %v, want none", dirs, err)
	}
	for _, d := range []string{f.imageDir, f.mountDir} {
		if entries, _ := os.ReadDir(d); len(entries) != 0 {
			t.Errorf("%s has %d entries after cleanup, want none", d, len(entries))
		}
	}
}

func TestBadInput(t *testing.T) {
	testutil.RequireRoot(t)
	f := openTest(t)
	for _, name := range []string{"", ".", "..", ".hidden", "a/b", "../x", "x\x00y", strings.Repeat("x", 201)} {
		if _, err := f.NewDir(t.Context(), name, MinLimit); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("NewDir(%q) = %v, want ErrInvalidArgument", name, err)
		}
		if err := f.RemoveDir(name); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("RemoveDir(%q) = %v, want ErrInvalidArgument", name, err)
		}
		if _, err := f.Usage(name); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("Usage(%q) = %v, want ErrInvalidArgument", name, err)
		}
	}
	for _, limit := range []int64{-1, 1, MinLimit - 1} {
		if _, err := f.NewDir(t.Context(), "ok", limit); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("NewDir(ok, %d) = %v, want ErrInvalidArgument", limit, err)
		}
	}
	if dirs, err := f.Dirs(); err != nil || len(dirs) != 0 {
		t.Errorf("Dirs() after bad input = %v, %v, want none", dirs, err)
	}
	// The default limit is 1 GiB; the image is sparse.
	p := newDir(t, f, "dflt", 0)
	if u, err := f.Usage("dflt"); err != nil || u.LimitBytes > DefaultLimit || u.LimitBytes < DefaultLimit*9/10 {
		t.Errorf("Usage(dflt) = %+v, %v, want LimitBytes about %d", u, err, DefaultLimit)
	}
	fi, err := os.Stat(f.image("dflt"))
	if err != nil {
		t.Fatal(err)
	}
	if used := fi.Sys().(*syscall.Stat_t).Blocks * 512; used > 16<<20 {
		t.Errorf("1 GiB image uses %d bytes on disk, want a sparse file", used)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("Stat(%s) = %v, %v, want mode 0755", p, fi, err)
	}
	if entries, _ := os.ReadDir(p); len(entries) != 0 {
		t.Errorf("new dir has %d entries, want none", len(entries))
	}
}

func TestOpenOptions(t *testing.T) {
	if _, err := Open(t.Context(), Options{ImageDir: t.TempDir()}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("Open without MountDir = %v, want ErrInvalidArgument", err)
	}
}

func TestParseMountInfo(t *testing.T) {
	tests := []struct {
		line string
		want mountInfo
		ok   bool
	}{
		{"36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue",
			mountInfo{"/mnt2", "ext3", "/dev/root", "rw,errors=continue"}, true},
		{`100 1 7:3 / /var/lib/with\040space rw shared:5 - ext4 /dev/loop3 rw,discard`,
			mountInfo{"/var/lib/with space", "ext4", "/dev/loop3", "rw,discard"}, true},
		{"garbage", mountInfo{}, false},
	}
	for _, tt := range tests {
		got, ok := parseMountInfo(tt.line)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseMountInfo(%q) = %+v, %v, want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
}

// TestPool proves that a pooled directory is limited like any other, that
// RemoveDir retires it at once, and that a new Open destroys what an
// earlier run left in the pool and the trash.
func TestPool(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	opts := Options{ImageDir: filepath.Join(base, "img"), MountDir: filepath.Join(base, "mnt"), PoolSize: 2}
	f, err := Open(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, f, 2)
	dir, err := f.NewDir(t.Context(), "pooled", DefaultLimit)
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := findMount(dir); m == nil {
		t.Fatalf("NewDir(pooled) = %s, not a mount point", dir)
	}
	u, err := f.Usage("pooled")
	if err != nil || u.LimitBytes > DefaultLimit || u.LimitBytes < DefaultLimit*9/10 {
		t.Errorf("Usage(pooled) = %+v, %v; want a limit near %d", u, err, DefaultLimit)
	}
	if err := f.RemoveDir("pooled"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after RemoveDir, %s: %v", dir, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// A restart destroys the ready filesystems left behind.
	f2, err := Open(t.Context(), Options{ImageDir: opts.ImageDir, MountDir: opts.MountDir})
	if err != nil {
		t.Fatal(err)
	}
	_ = f2
	f3, err := Open(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer f3.Close()
	ents, _ := os.ReadDir(filepath.Join(opts.MountDir, trashDir))
	if len(ents) != 0 {
		t.Errorf("trash not emptied on Open: %d entries", len(ents))
	}
	t.Cleanup(func() { closePool(f3, opts.MountDir) })
}

// waitPoolReady waits until f's pool holds n ready filesystems.
func waitPoolReady(t *testing.T, f *FS, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(f.pool.ready) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d filesystems ready after 20s, want %d", len(f.pool.ready), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// closePool closes f and removes what its pool left under mountDir: the
// ready and retired filesystems, and the private mount of the directory.
func closePool(f *FS, mountDir string) {
	f.Close()
	for _, d := range []string{poolDir, trashDir} {
		p := filepath.Join(mountDir, d)
		ents, _ := os.ReadDir(p)
		for _, e := range ents {
			f.destroy(filepath.Join(p, e.Name()), "")
		}
	}
	unix.Unmount(mountDir, unix.MNT_DETACH)
}

// TestPoolRefillDeferredAfterQuietTake: the first take after a quiet
// spell leaves its replacement for later while a filesystem is still
// ready; a take right after it, which leaves none, has the pool refilled
// at once.
func TestPoolRefillDeferredAfterQuietTake(t *testing.T) {
	testutil.RequireRoot(t)
	defer func(d time.Duration) { refillDefer = d }(refillDefer)
	refillDefer = time.Hour
	base := t.TempDir()
	opts := Options{ImageDir: filepath.Join(base, "img"), MountDir: filepath.Join(base, "mnt"), PoolSize: 2}
	f, err := Open(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closePool(f, opts.MountDir) })
	waitPoolReady(t, f, 2)
	if _, err := f.NewDir(t.Context(), "first", DefaultLimit); err != nil {
		t.Fatal(err)
	}
	// Making a filesystem takes milliseconds; none is made meanwhile.
	time.Sleep(500 * time.Millisecond)
	if n := len(f.pool.ready); n != 1 {
		t.Fatalf("%d filesystems ready half a second after a quiet take, want 1 (its refill deferred)", n)
	}
	if _, err := f.NewDir(t.Context(), "second", DefaultLimit); err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, f, 2)
	for _, name := range []string{"first", "second"} {
		if err := f.RemoveDir(name); err != nil {
			t.Error(err)
		}
	}
}

// TestFormatsOncePerSize: a new filesystem is a copy of a seed formatted
// once per size, not a run of mkfs.ext4 each (tens of milliseconds of CPU
// per sandbox); the copies are whole, clean filesystems of their own, and
// the seeds go with the FS.
func TestFormatsOncePerSize(t *testing.T) {
	testutil.RequireRoot(t)
	f := openTest(t)
	runs := filepath.Join(t.TempDir(), "runs")
	wrapper := filepath.Join(t.TempDir(), "mkfs")
	script := "#!/bin/sh\necho run >> " + runs + "\nexec " + f.mkfs + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	f.mkfs = wrapper
	a := newDir(t, f, "a", 16<<20)
	b := newDir(t, f, "b", 16<<20)
	newDir(t, f, "c", 8<<20)
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "run") != 2 {
		t.Errorf("mkfs.ext4 ran %d times for three filesystems of two sizes, want 2", strings.Count(string(b), "run"))
	}
	if err := os.WriteFile(filepath.Join(a, "only-a"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(b, "only-a")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a file written in a is in b: %v", err)
	}
	var sa, sb unix.Statfs_t
	if err := unix.Statfs(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(b, &sb); err != nil {
		t.Fatal(err)
	}
	if sa.Blocks != sb.Blocks || sa.Files != sb.Files || sa.Blocks*uint64(sa.Bsize) < 14<<20 {
		t.Errorf("copies differ or are short: %d×%d blocks, %d inodes; %d×%d, %d", sa.Blocks, sa.Bsize, sa.Files, sb.Blocks, sb.Bsize, sb.Files)
	}
	// A copy not yet mounted is a clean filesystem.
	img := filepath.Join(f.imageDir, "check.img")
	if err := f.createImage(t.Context(), img, 16<<20); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(img)
	if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
		t.Errorf("e2fsck of a copy: %v\n%s", err, out)
	}
	seeds, _ := filepath.Glob(filepath.Join(f.imageDir, seedPrefix+"*"))
	if len(seeds) != 2 {
		t.Errorf("seeds %v, want two", seeds)
	}
	// A seed removed by hand is formatted again, not a failed create.
	for _, sd := range seeds {
		os.Remove(sd)
	}
	newDir(t, f, "d", 16<<20)
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "run") != 3 {
		t.Errorf("mkfs.ext4 ran %d times after a seed was removed, want 3", strings.Count(string(b), "run"))
	}
	f.Close()
	if seeds, _ := filepath.Glob(filepath.Join(f.imageDir, seedPrefix+"*")); len(seeds) != 0 {
		t.Errorf("seeds left after Close: %v", seeds)
	}
}

// What every create copies is the metadata an empty filesystem needs, not
// blocks kept for growing it (which a sandbox's disk never does): 144 KiB
// at 1 GiB, where resize_inode's reserved blocks made it 656.
func TestImageHoldsOnlyItsMetadata(t *testing.T) {
	testutil.RequireRoot(t)
	f := openTest(t)
	defer f.Close()
	big := filepath.Join(f.imageDir, "big.img")
	if err := f.createImage(t.Context(), big, 1<<30); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(big)
	var st unix.Stat_t
	if err := unix.Stat(big, &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > 256<<10 {
		t.Errorf("a new 1 GiB image holds %d KiB, want at most 256", used>>10)
	}
	if out, err := exec.Command("e2fsck", "-fn", big).CombinedOutput(); err != nil {
		t.Errorf("e2fsck of a 1 GiB copy: %v\n%s", err, out)
	}
}

// TestPoolRestartsOnSymlinkedDirs runs an FS with a pool over directories
// reached through a symlink, the way a daemon's data dir may be, five
// times in a row, each run ended cleanly or cut short (its workers stopped
// with ready filesystems and directories left mounted, as by kill -9),
// alternately. Every Open must clean up what the run before left, and the
// last clean Close must leave no mount under the directories' real path and
// no loop device backed by an image there.
func TestPoolRestartsOnSymlinkedDirs(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	real := filepath.Join(base, "real")
	if err := os.Mkdir(real, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	opts := Options{ImageDir: filepath.Join(link, "img"), MountDir: filepath.Join(link, "mnt"), PoolSize: 2,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	t.Cleanup(func() {
		for _, mp := range testutil.MountPointsUnder(real) {
			unix.Unmount(mp, unix.MNT_DETACH)
		}
	})
	const runs = 5
	for run := range runs {
		crash := run%2 == 1 && run != runs-1
		f, err := Open(t.Context(), opts)
		if err != nil {
			t.Fatalf("run %d: Open: %v", run, err)
		}
		// What a daemon's start-up does: the directories of the run before
		// are removed.
		left, err := f.Dirs()
		if err != nil {
			t.Fatalf("run %d: Dirs: %v", run, err)
		}
		for _, n := range left {
			if err := f.RemoveDir(n); err != nil {
				t.Errorf("run %d: RemoveDir(%s) of the run before: %v", run, n, err)
			}
		}
		if n, err := countMounts(filepath.Join(real, "mnt")); n != 1 {
			t.Errorf("run %d: %d mounts at the mount dir after Open (%v), want 1", run, n, err)
		}
		waitPoolReady(t, f, 2)
		name := fmt.Sprintf("sb%d", run)
		if _, err := f.NewDir(t.Context(), name, DefaultLimit); err != nil {
			t.Fatalf("run %d: NewDir: %v", run, err)
		}
		waitPoolReady(t, f, 2)
		if crash {
			t.Logf("run %d: cut short with its pool and %s mounted", run, name)
			close(f.pool.stop)
			f.pool.wg.Wait()
			continue
		}
		t.Logf("run %d: closed cleanly", run)
		if err := f.RemoveDir(name); err != nil {
			t.Errorf("run %d: RemoveDir(%s): %v", run, name, err)
		}
		if err := f.Close(); err != nil {
			t.Errorf("run %d: Close: %v", run, err)
		}
	}
	if mps := testutil.MountPointsUnder(real); len(mps) > 0 {
		t.Errorf("after the last clean Close, %d mounts under %s remain: %q", len(mps), real, mps)
	}
	// A loop device detaches once its last mount is gone; the kernel may
	// finish that a moment after the unmount returns.
	deadline := time.Now().Add(10 * time.Second)
	for loops := testutil.LoopsUnder(real); len(loops) > 0; loops = testutil.LoopsUnder(real) {
		if time.Now().After(deadline) {
			t.Errorf("after the last clean Close, %d loop devices are backed by files under %s: %q", len(loops), real, loops)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestOpenResetsStackedMounts: what an earlier version left on a data dir
// reached through a symlink (a second bind mount of MountDir stacked on the
// first, hiding a directory and the pool mounted below it) and a loop
// device left attached to an image that is gone are both found and
// removed by an Open without a pool (the one-off FS a daemon cleans an old
// instance with), and Destroy leaves nothing mounted or attached.
func TestOpenResetsStackedMounts(t *testing.T) {
	testutil.RequireRoot(t)
	losetup, err := exec.LookPath("losetup")
	if err != nil {
		t.Skip("no losetup")
	}
	base := t.TempDir()
	opts := Options{ImageDir: filepath.Join(base, "img"), MountDir: filepath.Join(base, "mnt"), PoolSize: 1,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	t.Cleanup(func() {
		for _, mp := range testutil.MountPointsUnder(base) {
			unix.Unmount(mp, unix.MNT_DETACH)
		}
	})
	f, err := Open(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, f, 1)
	if _, err := f.NewDir(t.Context(), "a", MinLimit); err != nil {
		t.Fatal(err)
	}
	close(f.pool.stop) // a crash
	f.pool.wg.Wait()
	if err := unix.Mount(opts.MountDir, opts.MountDir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(opts.ImageDir, "orphan.img")
	if err := os.WriteFile(orphan, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(losetup, "-f", "--show", orphan).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command(losetup, "-d", dev).Run() })
	os.Remove(orphan)

	f2, err := Open(t.Context(), Options{ImageDir: opts.ImageDir, MountDir: opts.MountDir})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := countMounts(opts.MountDir); n != 0 || err != nil {
		t.Errorf("after Open over stacked mounts: %d mounts at MountDir (%v), want 0", n, err)
	}
	if dirs, err := f2.Dirs(); err != nil || !slices.Contains(dirs, "a") {
		t.Errorf("Dirs() = %v, %v; want a listed", dirs, err)
	}
	if err := f2.RemoveDir("a"); err != nil {
		t.Errorf("RemoveDir(a) = %v", err)
	}
	if err := f2.Destroy(); err != nil {
		t.Errorf("Destroy() = %v", err)
	}
	if mps := testutil.MountPointsUnder(base); len(mps) > 0 {
		t.Errorf("after Destroy, mounts remain: %q", mps)
	}
	deadline := time.Now().Add(10 * time.Second)
	for loops := testutil.LoopsUnder(base); len(loops) > 0; loops = testutil.LoopsUnder(base) {
		if time.Now().After(deadline) {
			t.Errorf("after Destroy, loop devices remain: %q", loops)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Options.Dirs are in every new filesystem, pooled or made at NewDir, and
// a path that is not clean, relative and below the root is refused.
func TestDirsMadeAhead(t *testing.T) {
	testutil.RequireRoot(t)
	for _, bad := range [][]string{{""}, {"/abs"}, {"."}, {".."}, {"../up"}, {"a/../b"}, {"a/"}} {
		base := t.TempDir()
		if _, err := Open(t.Context(), Options{ImageDir: filepath.Join(base, "img"), MountDir: filepath.Join(base, "mnt"), Dirs: bad}); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("Open with Dirs %q = %v, want ErrInvalidArgument", bad, err)
		}
	}
	base := t.TempDir()
	dirs := []string{"upper", "work", "upper/usr/bin"}
	f, err := Open(t.Context(), Options{ImageDir: filepath.Join(base, "img"), MountDir: filepath.Join(base, "mnt"), PoolSize: 1, Dirs: dirs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Destroy() })
	waitPoolReady(t, f, 1)
	pooled, err := f.NewDir(t.Context(), "pooled", DefaultLimit)
	if err != nil {
		t.Fatal(err)
	}
	made, err := f.NewDir(t.Context(), "made", MinLimit) // not the pool's size: made now
	if err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{pooled, made} {
		for _, d := range append(dirs, "upper/usr") {
			fi, err := os.Lstat(filepath.Join(root, d))
			if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
				t.Errorf("%s in %s: %v, %v; want a directory of mode 0755", d, root, fi, err)
			}
		}
		if ents, _ := os.ReadDir(root); len(ents) != 2 {
			t.Errorf("%s holds %d entries, want upper and work", root, len(ents))
		}
	}
}
