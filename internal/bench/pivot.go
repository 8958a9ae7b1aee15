package bench

import (
	"fmt"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// pivotRuns is how many pivot_root calls give the kernel's median, before
// the density run's sandboxes are created and with them all idle.
const pivotRuns = 20

// kernelPivots times n calls of the kernel's pivot_root (kernelPivot),
// each in a mount namespace of its own.
func kernelPivots(n int) Result {
	r := Result{Name: "pivot_root"}
	dir, err := os.MkdirTemp("", "fence-bench-pivot-")
	if err != nil {
		r.Err = err
		return r
	}
	defer os.Remove(dir)
	for range n {
		d, err := kernelPivot(dir)
		if err != nil {
			r.Err = err
			return r
		}
		r.Samples = append(r.Samples, d)
	}
	return r
}

// kernelPivot times one pivot_root into an empty tmpfs mounted on dir,
// made on a thread of its own in a mount namespace of its own: both end
// with the thread, and the host's mounts are not touched.
//
// Every start of a sandbox that pivots pays this (fence's and runc's
// once, bwrap's twice): to move the tasks whose root or working
// directory is the old root, pivot_root walks every thread on the host,
// holding the lock that every fork and exit on the host takes. Its cost
// grows with the threads alive, whoever runs them.
func kernelPivot(dir string) (time.Duration, error) {
	done := make(chan pivotResult, 1)
	go pivotThread(dir, done)
	r := <-done
	return r.d, r.err
}

type pivotResult struct {
	d   time.Duration
	err error
}

// pivotThread sends kernelPivot's result on done, from a thread that is
// not the process's main thread.
func pivotThread(dir string, done chan<- pivotResult) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// The main thread: /proc/self shows its namespaces, and the
		// runtime never ends it. Held here, locked, it cannot run the
		// probe's goroutine, which so runs on another thread.
		inner := make(chan pivotResult, 1)
		go pivotThread(dir, inner)
		done <- <-inner
		runtime.UnlockOSThread()
		return
	}
	// Never unlocked: the thread's mount namespace, root and working
	// directory are its own from the unshare on, and it exits with this
	// goroutine.
	d, err := pivotHere(dir)
	done <- pivotResult{d, err}
}

// pivotHere is kernelPivot's work, on the locked thread.
func pivotHere(dir string) (time.Duration, error) {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return 0, fmt.Errorf("pivot_root probe: unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return 0, fmt.Errorf("pivot_root probe: making mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k"); err != nil {
		return 0, fmt.Errorf("pivot_root probe: mounting tmpfs: %w", err)
	}
	if err := unix.Chdir(dir); err != nil {
		return 0, fmt.Errorf("pivot_root probe: %w", err)
	}
	start := time.Now()
	if err := unix.PivotRoot(".", "."); err != nil {
		return 0, fmt.Errorf("pivot_root probe: %w", err)
	}
	return time.Since(start), nil
}
