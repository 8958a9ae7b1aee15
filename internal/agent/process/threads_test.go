package process

import (
	"runtime"
	"sync"
	"testing"
)

// TrimThreads ends idle threads the runtime made for a busy moment, on
// one P, as the native agent runs.
func TestTrimThreads(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	// Four goroutines locked at once take four threads, idle once they
	// are unlocked.
	var locked, release sync.WaitGroup
	locked.Add(4)
	release.Add(1)
	var done sync.WaitGroup
	for range 4 {
		done.Go(func() {
			runtime.LockOSThread()
			locked.Done()
			release.Wait()
			runtime.UnlockOSThread()
		})
	}
	locked.Wait()
	release.Done()
	done.Wait()
	// Threads the caller and the runtime's handing over of its P keep
	// busy at the time cannot be ended: of the four, at least one is.
	n := TrimThreads(1 << 20) // counts, ends nothing
	if got := TrimThreads(n - 4); got >= n {
		t.Errorf("TrimThreads(%d) left %d threads of %d", n-4, got, n)
	}
}
