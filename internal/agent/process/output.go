package process

import (
	"sync"
	"time"

	pb "github.com/fencesandbox/fence/api/envd/process"
)

const (
	// maxQueued bounds the bytes of output queued for one stream.
	maxQueued = 4 << 20
	// maxMerged bounds one data message built from queued chunks.
	maxMerged = 256 << 10
)

// item is one queued event and the output budget bytes it holds.
type item struct {
	ev *pb.ProcessEvent
	n  int
}

// subscriber is one stream's bounded queue of process events.
//
// Queued data holds bytes of the agent's output budget until the stream
// has sent it. The producers (the process's output readers) block while
// the queue is full, which holds the process back through its pipe, but
// for at most the stall timeout: a stream that does not drain in that time
// is dropped and ends with an error, so one slow client can neither stop
// the process forever nor grow memory without bound. A client that reads
// promptly gets every byte.
type subscriber struct {
	b *budget

	mu       sync.Mutex
	queue    []item
	bytes    int
	lastTake time.Time
	space    chan struct{} // closed and replaced whenever the consumer takes
	notify   chan struct{} // cap 1: something to take
	dropped  bool          // the producer gave up on this subscriber
	gone     bool          // the consumer left
}

func newSubscriber(b *budget) *subscriber {
	return &subscriber{b: b, lastTake: time.Now(), space: make(chan struct{}), notify: make(chan struct{}, 1)}
}

func (s *subscriber) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// push queues ev, whose payload is n bytes already taken from the budget
// (released here if the event is not queued); control events (n == 0) are
// never held back.
func (s *subscriber) push(ev *pb.ProcessEvent, n int, stall time.Duration) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		s.mu.Lock()
		if s.gone || s.dropped {
			s.mu.Unlock()
			s.b.release(int64(n))
			return
		}
		if n == 0 || s.bytes == 0 || s.bytes+n <= maxQueued {
			s.queue = append(s.queue, item{ev, n})
			s.bytes += n
			s.mu.Unlock()
			s.wake()
			return
		}
		space := s.space
		s.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(stall)
		}
		select {
		case <-space:
		case <-timer.C:
			s.drop()
			s.b.release(int64(n))
			return
		}
	}
}

// drop discards the queue and marks the stream as having lost output.
func (s *subscriber) drop() {
	s.mu.Lock()
	if s.gone || s.dropped {
		s.mu.Unlock()
		return
	}
	s.dropped = true
	freed := s.emptyLocked()
	s.mu.Unlock()
	s.b.release(int64(freed))
	s.wake()
}

// dropIfStalled drops the stream if it holds output and has not taken any
// for the stall time.
func (s *subscriber) dropIfStalled(stall time.Duration) {
	s.mu.Lock()
	stalled := s.bytes > 0 && time.Since(s.lastTake) >= stall
	s.mu.Unlock()
	if stalled {
		s.drop()
	}
}

// take removes and returns everything queued, merging adjacent data
// events of the same kind; dropped reports that output was lost. The
// caller releases each item's bytes once it has sent it.
func (s *subscriber) take() (items []item, dropped bool) {
	s.mu.Lock()
	q := s.queue
	s.lastTake = time.Now()
	dropped = s.dropped
	if len(q) > 0 {
		s.emptyLocked()
	}
	s.mu.Unlock()
	return merge(q), dropped
}

// emptyLocked empties the queue, wakes the writers waiting for room and
// returns the bytes it held (the caller releases them to the budget once
// they are sent or dropped).
func (s *subscriber) emptyLocked() int {
	freed := s.bytes
	s.queue, s.bytes = nil, 0
	close(s.space)
	s.space = make(chan struct{})
	return freed
}

func (s *subscriber) close() {
	s.mu.Lock()
	s.gone = true
	freed := s.emptyLocked()
	s.mu.Unlock()
	s.b.release(int64(freed))
}

func merge(q []item) []item {
	if len(q) < 2 {
		return q
	}
	out := q[:0:0]
	for _, it := range q {
		if len(out) > 0 {
			if prev := out[len(out)-1]; mergeable(prev.ev, it.ev) {
				out[len(out)-1] = item{appendData(prev.ev, it.ev), prev.n + it.n}
				continue
			}
		}
		out = append(out, it)
	}
	return out
}

func dataOf(ev *pb.ProcessEvent) (kind int, b []byte) {
	d := ev.GetData()
	if d == nil {
		return 0, nil
	}
	switch o := d.GetOutput().(type) {
	case *pb.ProcessEvent_DataEvent_Stdout:
		return 1, o.Stdout
	case *pb.ProcessEvent_DataEvent_Stderr:
		return 2, o.Stderr
	case *pb.ProcessEvent_DataEvent_Pty:
		return 3, o.Pty
	}
	return 0, nil
}

func mergeable(a, b *pb.ProcessEvent) bool {
	ka, da := dataOf(a)
	kb, db := dataOf(b)
	return ka != 0 && ka == kb && len(da)+len(db) <= maxMerged
}

func appendData(a, b *pb.ProcessEvent) *pb.ProcessEvent {
	k, da := dataOf(a)
	_, db := dataOf(b)
	buf := make([]byte, 0, len(da)+len(db))
	buf = append(append(buf, da...), db...)
	return dataEvent(k, buf)
}

func dataEvent(kind int, b []byte) *pb.ProcessEvent {
	d := &pb.ProcessEvent_DataEvent{}
	switch kind {
	case 1:
		d.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}
	case 2:
		d.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}
	default:
		d.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: b}
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}}
}
