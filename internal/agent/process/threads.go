package process

import (
	"runtime"
	"runtime/metrics"
	"time"

	"golang.org/x/sys/unix"
)

// threadsMetric is the runtime metric TrimThreads reads.
const threadsMetric = "/sched/threads/total:threads"

// WarmThreadCount reads the runtime's thread count once, ahead of the
// first TrimThreads (at the end of a sandbox's first command): the first
// read of any runtime metric builds the runtime's table of every metric,
// about 0.1 ms. It opens nothing and changes nothing.
func WarmThreadCount() {
	metrics.Read([]metrics.Sample{{Name: threadsMetric}})
}

// TrimThreads ends idle OS threads of the Go runtime until at most want
// are left, and reports how many are left. The runtime keeps every thread
// it has made for good, each one a task of the sandbox's pids budget; a
// busy moment (an init's setup, a command's start) leaves one or two more
// than an idle agent needs. A goroutine that exits locked to its thread
// ends the thread; the runtime starts a new one when it needs more. The
// process's main thread is never ended (the runtime would park it for
// good instead), and a few tries at most are made.
func TrimThreads(want int) int {
	sample := []metrics.Sample{{Name: threadsMetric}}
	threads := func() int {
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return int(sample[0].Value.Uint64())
	}
	n := threads()
	if n <= want {
		return n
	}
	// Locked, this goroutine keeps its own thread while it waits: the
	// goroutine below runs on another.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// A goroutine that finds itself on the main thread keeps it, locked,
	// until the trim is done: the runtime hands idle threads out last
	// idled first, and would give the next try the main thread again.
	release := make(chan struct{})
	defer close(release)
	for range 8 {
		if n <= want {
			return n
		}
		ended := make(chan bool, 1)
		go func() {
			runtime.LockOSThread()
			if unix.Gettid() == unix.Getpid() {
				ended <- false
				<-release
				runtime.UnlockOSThread()
				return
			}
			ended <- true // never unlocked: the thread ends with the goroutine
		}()
		if !<-ended {
			continue
		}
		// The thread ends once the goroutine has returned.
		for range 100 {
			if m := threads(); m < n {
				n = m
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	return n
}
