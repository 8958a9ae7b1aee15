package native

import (
	"context"
	"testing"
	"time"
)

// Every take of a ready init, the first or one right after another, asks
// for a refill that waits for the end of the sandbox that took the init;
// an init found dead is replaced at once.
func TestRefillWaitsForTheTakersEnd(t *testing.T) {
	b := &Backend{ready: make(chan *readyInit, 3), room: make(chan (<-chan struct{}), 3)}
	dead := &readyInit{exited: make(chan struct{})}
	close(dead.exited)
	b.ready <- dead
	for range 2 {
		b.ready <- &readyInit{exited: make(chan struct{})}
	}
	for i := range 2 {
		r, refill, err := b.takeInit()
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if got := <-b.room; got != nil {
				t.Errorf("the dead init's refill waits for %v, want nothing", got)
			}
		}
		refill()
		refill() // once only
		if got := <-b.room; got != r.exited {
			t.Errorf("take %d: refill waits for %v, want its sandbox's end", i, got)
		}
		if len(b.room) != 0 {
			t.Errorf("take %d: %d tokens for one take", i, len(b.room)+1)
		}
	}
}

// A deferred refill waits while an init is ready, and starts as soon as
// none is or the sandbox that took the init has ended.
func TestWaitRefillEndsWhenNoneReadyOrTheTakerEnds(t *testing.T) {
	defer func(d time.Duration) { refillDefer = d }(refillDefer)
	refillDefer = time.Hour
	b := &Backend{ready: make(chan *readyInit, 1)}
	b.waitRefill(context.Background(), make(chan struct{})) // none ready: returns at once

	b.ready <- &readyInit{exited: make(chan struct{})}
	wait := func(ended chan struct{}) chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			b.waitRefill(context.Background(), ended)
		}()
		select {
		case <-done:
			t.Fatal("waitRefill returned with an init ready, its sandbox alive and its time not up")
		case <-time.After(50 * time.Millisecond):
		}
		return done
	}
	done := wait(make(chan struct{}))
	<-b.ready // a create takes the last one
	<-done

	b.ready <- &readyInit{exited: make(chan struct{})}
	ended := make(chan struct{})
	done = wait(ended)
	close(ended) // the sandbox was killed
	<-done
}
