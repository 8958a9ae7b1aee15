package quota

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/testutil"
)

// TestLoopBoundWithoutASearch: while directories accumulate, each one's
// loop device is the one after the last bound when that one is free, with
// no LOOP_CTL_GET_FREE (which goes over every bound loop device on the
// host); a device in use is never taken: one bound by another owner is
// passed over, and the kernel's search finds a free one.
func TestLoopBoundWithoutASearch(t *testing.T) {
	testutil.RequireRoot(t)
	f := openTest(t)
	last := loopNumber(t, newDir(t, f, "first", 16<<20))
	found := false
	for i := range 3 { // another program on the host may take the next device meanwhile
		ensureLoop(t, last+1)
		searches := loopSearches.Load()
		dir := newDir(t, f, "next"+strconv.Itoa(i), 16<<20)
		n := loopNumber(t, dir)
		if n == last+1 && loopSearches.Load() == searches {
			found = true
			break
		}
		t.Logf("directory %d: /dev/loop%d after /dev/loop%d, %d searches", i, n, last, loopSearches.Load()-searches)
		last = n
	}
	if !found {
		t.Errorf("no directory of three took the free device after the last bound without LOOP_CTL_GET_FREE")
	}

	// The next device bound by another owner: passed over, searched for.
	taken := last + 1
	for range 8 {
		taken = loopNumber(t, newDir(t, f, fmt.Sprintf("x%d", taken), 16<<20)) + 1
		ensureLoop(t, taken)
		if bindOther(t, taken) {
			break
		}
	}
	searches := loopSearches.Load()
	dir := newDir(t, f, "after-taken", 16<<20)
	if n := loopNumber(t, dir); n == taken || loopSearches.Load() == searches {
		t.Errorf("beside /dev/loop%d bound by another owner, the directory got /dev/loop%d with %d searches; want another device, found by a search", taken, n, loopSearches.Load()-searches)
	}
}

// loopNumber returns N of the /dev/loopN mounted at dir.
func loopNumber(t *testing.T, dir string) int {
	t.Helper()
	m, err := findMount(dir)
	if err != nil || m == nil || !strings.HasPrefix(m.source, "/dev/loop") {
		t.Fatalf("findMount(%s) = %+v, %v; want a loop device", dir, m, err)
	}
	n, err := strconv.Atoi(strings.TrimPrefix(m.source, "/dev/loop"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ensureLoop makes /dev/loopN if the kernel has no such device yet.
func ensureLoop(t *testing.T, n int) {
	t.Helper()
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ctl)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(ctl), unix.LOOP_CTL_ADD, uintptr(n)); errno != 0 && errno != unix.EEXIST {
		t.Fatalf("LOOP_CTL_ADD %d: %v", n, errno)
	}
	if _, err := os.Stat(fmt.Sprintf("/dev/loop%d", n)); err != nil {
		if err := unix.Mknod(fmt.Sprintf("/dev/loop%d", n), unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); err != nil {
			t.Fatal(err)
		}
	}
}

// bindOther binds /dev/loopN to a file of the test's (not a quota image)
// until the test ends; false if the device was not free.
func bindOther(t *testing.T, n int) bool {
	t.Helper()
	backing, err := os.CreateTemp(t.TempDir(), "other")
	if err != nil {
		t.Fatal(err)
	}
	defer backing.Close()
	if err := backing.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	loop, err := os.OpenFile(fmt.Sprintf("/dev/loop%d", n), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := configureLoop(loop, backing, backing.Name()); err != nil {
		loop.Close()
		return false
	}
	t.Cleanup(func() {
		unix.IoctlSetInt(int(loop.Fd()), unix.LOOP_CLR_FD, 0)
		loop.Close()
	})
	return true
}
