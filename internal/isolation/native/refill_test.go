package native

import (
	"context"
	"testing"
	"time"
)

// Every take of a ready init, the first or one right after another, asks
// for a refill that waits for the kill or the end of the sandbox that took
// the init; an init found dead is replaced at once.
func TestRefillWaitsForTheTakersEnd(t *testing.T) {
	b := &Backend{ready: make(chan *readyInit, 3), room: make(chan refillAfter, 3)}
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
			if got := <-b.room; got != (refillAfter{}) {
				t.Errorf("the dead init's refill waits for %v, want nothing", got)
			}
		}
		killed := make(chan struct{})
		refill(killed)
		refill(killed) // once only
		if got := <-b.room; got.killed != killed || got.exited != r.exited {
			t.Errorf("take %d: refill waits for %v, want its sandbox's kill or end", i, got)
		}
		if len(b.room) != 0 {
			t.Errorf("take %d: %d tokens for one take", i, len(b.room)+1)
		}
	}
}

// A deferred refill waits while an init is ready, and starts as soon as
// none is or the sandbox that took the init is killed or has ended.
func TestWaitRefillEndsWhenNoneReadyOrTheTakerEnds(t *testing.T) {
	defer func(d time.Duration) { refillDefer = d }(refillDefer)
	refillDefer = time.Hour
	b := &Backend{ready: make(chan *readyInit, 1)}
	alive := refillAfter{killed: make(chan struct{}), exited: make(chan struct{})}
	b.waitRefill(context.Background(), alive) // none ready: returns at once

	b.ready <- &readyInit{exited: make(chan struct{})}
	wait := func(after refillAfter) chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			b.waitRefill(context.Background(), after)
		}()
		select {
		case <-done:
			t.Fatal("waitRefill returned with an init ready, its sandbox alive and its time not up")
		case <-time.After(50 * time.Millisecond):
		}
		return done
	}
	done := wait(alive)
	<-b.ready // a create takes the last one
	<-done

	for _, which := range []string{"killed", "exited"} {
		b.ready <- &readyInit{exited: make(chan struct{})}
		killed, exited := make(chan struct{}), make(chan struct{})
		done = wait(refillAfter{killed: killed, exited: exited})
		if which == "killed" {
			close(killed)
		} else {
			close(exited) // the sandbox's init died by itself
		}
		<-done
		<-b.ready
	}
}
