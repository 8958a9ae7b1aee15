package native_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/isolation/native"
)

// The files a process holds for a checkpoint are its files open for
// writing, whichever of its tables of descriptors holds them, and not its
// sockets, pipes, eventfds or read-only files; the table its threads
// share is read once, and a table a thread unshared once more.
func TestHeldInodes(t *testing.T) {
	dir := t.TempDir()
	ino := func(fd int) uint64 {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	open := func(name string, flags int) int {
		fd, err := unix.Open(filepath.Join(dir, name), flags|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	written, readOnly := open("w", unix.O_WRONLY), open("r", unix.O_RDONLY)
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sock)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	ev, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ev)

	// Threads sharing the process's table, and one with a table of its
	// own holding a file open for writing that no other table holds.
	stop := make(chan struct{})
	defer close(stop)
	ready := make(chan uint64)
	// ownTable gives its thread a table of its own. Never the process's
	// first thread: /proc/self/fd shows that thread's table whichever
	// thread reads it, and the runtime never ends that thread but parks
	// it for good, so that every /proc/self/fd/N path of the package's
	// later tests (the agents' sockets among them) would name the stale
	// copy's descriptor N.
	var ownTable func()
	ownTable = func() {
		runtime.LockOSThread() // never unlocked: the thread ends with its goroutine
		if unix.Gettid() == unix.Getpid() {
			// Held here, so that another goroutine takes the part on
			// another thread.
			go ownTable()
			<-stop
			runtime.UnlockOSThread()
			return
		}
		if err := unix.Unshare(unix.CLONE_FILES); err != nil {
			t.Error(err)
			ready <- 0
			return
		}
		fd, err := unix.Open(filepath.Join(dir, "own"), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		if err != nil {
			t.Error(err)
			ready <- 0
			return
		}
		var st unix.Stat_t
		unix.Fstat(fd, &st)
		ready <- st.Ino
		<-stop
		unix.Close(fd)
	}
	go ownTable()
	for range 3 {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			ready <- 0
			<-stop
		}()
	}
	var own uint64
	for range 4 {
		own += <-ready
	}
	if t.Failed() {
		t.FailNow()
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	before := native.FDTablesRead()
	held, err := native.HeldInodes([]int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	if n := native.FDTablesRead() - before; n != 2 {
		t.Errorf("%d tables of descriptors read for %d threads, want 2 (the shared one and the unshared one)", n, len(tasks))
	}
	for name, want := range map[string]struct {
		ino  uint64
		held bool
	}{
		"a file open for writing":                  {ino(written), true},
		"a file open for writing in its own table": {own, true},
		"a file open for reading":                  {ino(readOnly), false},
		"a socket":                                 {ino(sock), false},
		"a pipe's write end":                       {ino(p[1]), false},
		"an eventfd":                               {ino(ev), false},
	} {
		if _, ok := held[want.ino]; ok != want.held {
			t.Errorf("%s (inode %d): held %v, want %v", name, want.ino, ok, want.held)
		}
	}
	// The process's first thread still has the process's table: what
	// /proc/self/fd shows is what this process holds.
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(d)
	if got, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(d)); err != nil || got != dir {
		t.Errorf("/proc/self/fd/%d = %q, %v; want %s (the first thread's table is no longer the process's)", d, got, err, dir)
	}
}
