package process

import (
	"bytes"
	"testing"
	"time"

	pb "github.com/fencesandbox/fence/api/envd/process"
)

func TestSubscriberMergesInOrder(t *testing.T) {
	s := newSubscriber(newBudget(64 << 20))
	s.push(dataEvent(1, []byte("a")), 1, time.Second)
	s.push(dataEvent(1, []byte("b")), 1, time.Second)
	s.push(dataEvent(2, []byte("e")), 1, time.Second)
	s.push(dataEvent(1, []byte("c")), 1, time.Second)
	items, dropped := s.take()
	var got []string
	for _, it := range items {
		_, b := dataOf(it.ev)
		got = append(got, string(b))
	}
	if dropped || len(got) != 3 || got[0] != "ab" || got[1] != "e" || got[2] != "c" {
		t.Errorf("take() = %q, dropped %v; want [ab e c], false", got, dropped)
	}
}

func TestSubscriberBackpressureAndDrop(t *testing.T) {
	s := newSubscriber(newBudget(64 << 20))
	chunk := bytes.Repeat([]byte("x"), maxQueued/2)
	s.push(dataEvent(1, chunk), len(chunk), time.Second)
	s.push(dataEvent(1, chunk), len(chunk), time.Second)

	// A full queue holds the producer until the consumer takes.
	done := make(chan struct{})
	go func() {
		s.push(dataEvent(1, chunk), len(chunk), time.Minute)
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("push into a full queue returned before the consumer took anything")
	case <-time.After(50 * time.Millisecond):
	}
	if evs, _ := s.take(); len(evs) == 0 {
		t.Fatal("take() returned nothing")
	}
	<-done

	// A consumer that never takes is dropped after the stall timeout.
	s.push(dataEvent(1, chunk), len(chunk), time.Second)
	s.push(dataEvent(1, chunk), len(chunk), 10*time.Millisecond)
	if _, dropped := s.take(); !dropped {
		t.Error("stalled subscriber not dropped")
	}
	// Once dropped, pushes never block.
	s.push(dataEvent(1, chunk), len(chunk), time.Hour)
	s.push(&pb.ProcessEvent{}, 0, time.Hour)
}

func TestBudgetBlocksAndReleases(t *testing.T) {
	b := newBudget(100)
	if !b.acquire(60, nil, time.Hour, nil) || b.used() != 60 {
		t.Fatalf("acquire(60) of 100: used %d", b.used())
	}
	got := make(chan bool)
	go func() { got <- b.acquire(60, nil, time.Hour, nil) }()
	select {
	case <-got:
		t.Fatal("acquire(60) with 40 left returned before a release")
	case <-time.After(50 * time.Millisecond):
	}
	b.release(60)
	if !<-got || b.used() != 60 {
		t.Errorf("after release: used %d, want 60", b.used())
	}
	stop := make(chan struct{})
	close(stop)
	if b.acquire(60, stop, time.Hour, nil) {
		t.Error("acquire with stop closed and no room succeeded")
	}
	stalls := 0
	ok := b.acquire(60, nil, 10*time.Millisecond, func() { stalls++; b.release(60) })
	if !ok || stalls != 1 {
		t.Errorf("acquire with onStall freeing room: %v after %d stalls", ok, stalls)
	}
}

func TestSubscriberReleasesBudget(t *testing.T) {
	b := newBudget(1 << 20)
	s := newSubscriber(b)
	for range 3 {
		b.acquire(100, nil, time.Hour, nil)
		s.push(dataEvent(1, make([]byte, 100)), 100, time.Second)
	}
	items, _ := s.take()
	held := 0
	for _, it := range items {
		held += it.n
		b.release(int64(it.n))
	}
	if held != 300 || b.used() != 0 {
		t.Errorf("take() items hold %d bytes, budget used %d after release; want 300, 0", held, b.used())
	}
	b.acquire(100, nil, time.Hour, nil)
	s.push(dataEvent(1, make([]byte, 100)), 100, time.Second)
	s.close()
	if b.used() != 0 {
		t.Errorf("budget used %d after close, want 0", b.used())
	}
	b.acquire(100, nil, time.Hour, nil)
	s.push(dataEvent(1, make([]byte, 100)), 100, time.Second) // gone: released at once
	if b.used() != 0 {
		t.Errorf("budget used %d after push to a closed stream, want 0", b.used())
	}
}
