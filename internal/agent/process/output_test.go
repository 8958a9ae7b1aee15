package process

import (
	"bytes"
	"testing"
	"time"

	pb "github.com/fencesandbox/fence/api/envd/process"
)

func TestSubscriberMergesInOrder(t *testing.T) {
	s := newSubscriber()
	s.push(dataEvent(1, []byte("a")), 1, time.Second)
	s.push(dataEvent(1, []byte("b")), 1, time.Second)
	s.push(dataEvent(2, []byte("e")), 1, time.Second)
	s.push(dataEvent(1, []byte("c")), 1, time.Second)
	evs, dropped := s.take()
	var got []string
	for _, ev := range evs {
		_, b := dataOf(ev)
		got = append(got, string(b))
	}
	if dropped || len(got) != 3 || got[0] != "ab" || got[1] != "e" || got[2] != "c" {
		t.Errorf("take() = %q, dropped %v; want [ab e c], false", got, dropped)
	}
}

func TestSubscriberBackpressureAndDrop(t *testing.T) {
	s := newSubscriber()
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
