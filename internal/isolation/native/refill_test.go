package native

import (
	"context"
	"testing"
	"time"
)

// A take after a quiet spell asks for a deferred refill; one right after
// another does not.
func TestRefillDeferredAfterQuietSpell(t *testing.T) {
	b := &Backend{ready: make(chan *readyInit, 2), room: make(chan bool, 2)}
	for range 2 {
		b.ready <- &readyInit{exited: make(chan struct{})}
	}
	for i, want := range []bool{true, false} {
		_, refill, err := b.takeInit()
		if err != nil {
			t.Fatal(err)
		}
		refill()
		if got := <-b.room; got != want {
			t.Errorf("take %d: refill deferrable = %v, want %v", i, got, want)
		}
	}
}

// A deferred refill waits while an init is ready, and starts as soon as
// none is.
func TestWaitRefillEndsWhenNoneReady(t *testing.T) {
	defer func(d time.Duration) { refillDefer = d }(refillDefer)
	refillDefer = time.Hour
	b := &Backend{ready: make(chan *readyInit, 1)}
	b.waitRefill(context.Background()) // none ready: returns at once

	b.ready <- &readyInit{exited: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.waitRefill(context.Background())
	}()
	select {
	case <-done:
		t.Fatal("waitRefill returned with an init ready and its time not up")
	case <-time.After(50 * time.Millisecond):
	}
	<-b.ready // a create takes the last one
	<-done
}
