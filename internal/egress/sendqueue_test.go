package egress

import (
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// heldWriter is a link that records what it is given, in order, and holds
// every write until released (closed hold: writes pass at once).
type heldWriter struct {
	hold    chan struct{}
	mu      sync.Mutex
	written []byte // each packet's one byte
	writes  int
	entered chan struct{} // one value per write begun
}

func newHeldWriter() *heldWriter {
	return &heldWriter{hold: make(chan struct{}), entered: make(chan struct{}, 4096)}
}

func (w *heldWriter) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	w.entered <- struct{}{}
	<-w.hold
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes++
	for _, pkt := range pkts.AsSlice() {
		w.written = append(w.written, pkt.Data().AsRange().ToSlice()...)
	}
	return pkts.Len(), nil
}

func (w *heldWriter) got() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]byte(nil), w.written...)
}

func onePacket(b byte) *stack.PacketBuffer {
	return stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData([]byte{b})})
}

// TestSendQueueWritesInOrderOffTheCaller: the stack's write returns while
// the link's write is held (the link is written by the queue's goroutine),
// every packet reaches the link once and in order, and once the queue is
// empty no writer is left running.
func TestSendQueueWritesInOrderOffTheCaller(t *testing.T) {
	w := newHeldWriter()
	q := newSendQueue(w)
	defer q.Close()
	var pkts []*stack.PacketBuffer
	for i := range 200 {
		pkt := onePacket(byte(i))
		pkts = append(pkts, pkt)
		if err := q.WritePacket(pkt); err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		pkt.DecRef() // the caller's reference; the queue holds its own
	}
	<-w.entered // the writer is inside the link's write; the callers were not held
	close(w.hold)
	deadline := time.Now().Add(10 * time.Second)
	for len(w.got()) < len(pkts) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	got := w.got()
	if len(got) != len(pkts) {
		t.Fatalf("the link got %d packets, want %d", len(got), len(pkts))
	}
	for i, b := range got {
		if b != byte(i) {
			t.Fatalf("packet %d reached the link as the %dth", b, i)
		}
	}
	for time.Now().Before(deadline) {
		q.mu.Lock()
		writing, backlog := q.writing, q.pkts
		q.mu.Unlock()
		if !writing {
			if cap(backlog) > writeBatch {
				t.Errorf("the idle queue keeps a backlog array of %d", cap(backlog))
			}
			break
		}
		time.Sleep(time.Millisecond)
	}
	for i, pkt := range pkts {
		if r := pkt.ReadRefs(); r != 0 {
			t.Fatalf("packet %d: %d references left after its write", i, r)
		}
	}
}

// TestSendQueueBoundedAndClosed: while the link's write is held, the queue
// takes at most maxQueued packets and refuses the rest; Close waits for
// the write under way, drops what is queued (releasing it), and refuses
// what comes after.
func TestSendQueueBoundedAndClosed(t *testing.T) {
	w := newHeldWriter()
	q := newSendQueue(w)
	first := onePacket(0)
	if err := q.WritePacket(first); err != nil {
		t.Fatal(err)
	}
	first.DecRef()
	<-w.entered // the writer holds the first packet, in the link
	var queued []*stack.PacketBuffer
	refused := 0
	for i := range maxQueued + 100 {
		pkt := onePacket(byte(i))
		switch err := q.WritePacket(pkt); err.(type) {
		case nil:
			queued = append(queued, pkt)
			continue
		case *tcpip.ErrNoBufferSpace:
			refused++
		default:
			t.Fatalf("packet %d: %v", i, err)
		}
		pkt.DecRef()
	}
	if len(queued) != maxQueued || refused != 100 {
		t.Fatalf("queued %d and refused %d of %d, want %d and 100", len(queued), refused, maxQueued+100, maxQueued)
	}
	closed := make(chan struct{})
	go func() { q.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a write was under way")
	case <-time.After(50 * time.Millisecond):
	}
	close(w.hold)
	<-closed
	if n := len(w.got()); n != 1 {
		t.Errorf("the link got %d packets, want only the one being written at Close", n)
	}
	for i, pkt := range queued {
		if r := pkt.ReadRefs(); r != 1 { // the test's own
			t.Fatalf("queued packet %d: %d references after Close, want only the test's", i, r)
		}
		pkt.DecRef()
	}
	late := onePacket(9)
	defer late.DecRef()
	if _, ok := q.WritePacket(late).(*tcpip.ErrClosedForSend); !ok {
		t.Error("a closed queue took a packet")
	}
}
