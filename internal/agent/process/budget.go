package process

import (
	"sync"
	"time"
)

// DefaultOutputBudget is the bytes of process output the agent holds at
// once, across every process, stream and PTY, unless Options says
// otherwise.
const DefaultOutputBudget = 32 << 20

// budget is a semaphore of bytes shared by every output reader of the
// agent. A reader acquires before it reads from a process's pipe; the bytes
// are released once the stream that queued them has sent them (or was
// dropped, reporting the loss). When the budget is spent, readers stop
// reading and the processes block on write: backpressure, nothing
// dropped.
type budget struct {
	mu    sync.Mutex
	avail int64
	total int64
	freed chan struct{} // closed and replaced on every release
}

func newBudget(total int64) *budget {
	return &budget{avail: total, total: total, freed: make(chan struct{})}
}

// acquire takes n bytes, waiting while they are not available. It gives up
// and returns false when stop is closed. Every stall it waits without
// progress, it calls onStall (which may free bytes by dropping streams
// that stopped reading).
func (b *budget) acquire(n int64, stop <-chan struct{}, stall time.Duration, onStall func()) bool {
	n = min(n, b.total)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		b.mu.Lock()
		if b.avail >= n {
			b.avail -= n
			b.mu.Unlock()
			return true
		}
		freed := b.freed
		b.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(stall)
		}
		select {
		case <-freed:
		case <-stop:
			return false
		case <-timer.C:
			if onStall != nil {
				onStall()
			}
			timer.Reset(stall)
		}
	}
}

// release returns n bytes.
func (b *budget) release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.avail = min(b.avail+n, b.total)
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// used returns the bytes currently held.
func (b *budget) used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total - b.avail
}
