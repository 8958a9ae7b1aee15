package egress

import (
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// heldWriter is a link that records what it is given, in order, and holds
// every write until released (closed hold: writes pass at once).
type heldWriter struct {
	hold    chan struct{}
	mu      sync.Mutex
	written []byte // each packet's first byte
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
		if data := pkt.Data().AsRange().ToSlice(); len(data) > 0 {
			w.written = append(w.written, data[0])
		} else { // a TCP segment without data: its source port's low byte
			w.written = append(w.written, byte(header.TCP(pkt.TransportHeader().Slice()).SourcePort()))
		}
	}
	return pkts.Len(), nil
}

func (w *heldWriter) got() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]byte(nil), w.written...)
}

// onePacket is a packet too large to be written inline, its first byte b.
func onePacket(b byte) *stack.PacketBuffer {
	data := make([]byte, inlineMax+1)
	data[0] = b
	return stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(data)})
}

// smallPacket is a one-byte packet, b.
func smallPacket(b byte) *stack.PacketBuffer {
	return stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData([]byte{b})})
}

// tcpPacket is a small TCP segment with flags and a one-byte payload b.
func tcpPacket(b byte, flags header.TCPFlags) *stack.PacketBuffer {
	return tcpSegment(b, flags, []byte{b})
}

// tcpSegment is a TCP segment from port b with flags and data.
func tcpSegment(b byte, flags header.TCPFlags, data []byte) *stack.PacketBuffer {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{
		ReserveHeaderBytes: header.TCPMinimumSize,
		Payload:            buffer.MakeWithData(data),
	})
	tcp := header.TCP(pkt.TransportHeader().Push(header.TCPMinimumSize))
	tcp.Encode(&header.TCPFields{SrcPort: uint16(b), DstPort: 4000, DataOffset: header.TCPMinimumSize, Flags: flags, WindowSize: 1024})
	pkt.TransportProtocolNumber = header.TCPProtocolNumber
	return pkt
}

// TestSendQueueWritesSmallPacketsInline: a small packet that finds the
// queue idle is written on its sender's goroutine (the sender's write
// returns only once the link's has); packets that come while it is
// written are queued behind it (their senders not held) and reach the
// link after it, in order; a SYN, a large segment and a bare
// acknowledgement are never written inline; and no writer is left once
// all is written.
func TestSendQueueWritesSmallPacketsInline(t *testing.T) {
	w := newHeldWriter()
	q := newSendQueue(w)
	var release sync.Once
	defer q.Close()
	defer release.Do(func() { close(w.hold) }) // before Close, which waits for the write
	first := tcpPacket(0, header.TCPFlagAck|header.TCPFlagPsh)
	returned := make(chan struct{})
	go func() {
		if err := q.WritePacket(first); err != nil {
			t.Error(err)
		}
		close(returned)
	}()
	<-w.entered // the link's write of the first packet has begun
	select {
	case <-returned:
		t.Fatal("the sender of a small packet to an idle queue was not the one writing it")
	case <-time.After(50 * time.Millisecond):
	}
	// Meanwhile: queued behind it, their senders not held.
	later := []*stack.PacketBuffer{smallPacket(1), onePacket(2), tcpPacket(3, header.TCPFlagAck)}
	for i, pkt := range later {
		if err := q.WritePacket(pkt); err != nil {
			t.Fatalf("packet %d: %v", i+1, err)
		}
	}
	release.Do(func() { close(w.hold) })
	<-returned
	waitIdle(t, q)
	if got := w.got(); string(got) != "\x00\x01\x02\x03" {
		t.Fatalf("the link got %v, want packets 0 to 3 in order", got)
	}
	if n := q.inlined.Load(); n != 1 {
		t.Fatalf("%d packets written inline, want 1 (the others came while it was written)", n)
	}

	// On the idle queue: a small packet inline, a SYN and a large one not.
	for i, tc := range []struct {
		pkt    *stack.PacketBuffer
		inline bool
	}{
		{smallPacket(4), true},
		{tcpPacket(5, header.TCPFlagSyn|header.TCPFlagAck), false},
		{onePacket(6), false},
		{tcpSegment(7, header.TCPFlagAck, nil), false},
		{tcpSegment(8, header.TCPFlagAck|header.TCPFlagFin, nil), true},
	} {
		n0 := q.inlined.Load()
		if err := q.WritePacket(tc.pkt); err != nil {
			t.Fatal(err)
		}
		waitIdle(t, q)
		tc.pkt.DecRef()
		if inlined := q.inlined.Load() > n0; inlined != tc.inline {
			t.Errorf("packet %d: written inline %v, want %v", i+4, inlined, tc.inline)
		}
	}
	if got := w.got(); string(got) != "\x00\x01\x02\x03\x04\x05\x06\x07\x08" {
		t.Fatalf("the link got %v, want packets 0 to 8 in order", got)
	}
	for i, pkt := range append([]*stack.PacketBuffer{first}, later...) {
		pkt.DecRef()
		if r := pkt.ReadRefs(); r != 0 {
			t.Fatalf("packet %d: %d references left after its write", i, r)
		}
	}
}

// waitIdle waits until q has no writer (nor an inline write) under way.
func waitIdle(t *testing.T, q *sendQueue) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		q.mu.Lock()
		writing := q.writing
		q.mu.Unlock()
		if !writing {
			return
		}
	}
	t.Fatal("the queue still writing after 10 s")
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

// TestSendQueueWriterStaysForBulkFlows: while a bulk flow is open (stay),
// the writer that has written a burst waits for the next one instead of
// ending, so that five bursts start one writer (five without stay), in
// order; a small packet that comes meanwhile is still written by its
// sender, and the next burst wakes the same writer; the last leave ends
// it, after which the queue starts a writer per burst again; and Close
// ends one that waits.
func TestSendQueueWriterStaysForBulkFlows(t *testing.T) {
	w := newHeldWriter()
	close(w.hold) // writes pass at once
	q := newSendQueue(w)
	defer q.Close()
	q.stay()
	q.stay() // two bulk flows
	var want []byte
	burst := func(first byte) {
		t.Helper()
		for i := range byte(3) {
			pkt := onePacket(first + i)
			if err := q.WritePacket(pkt); err != nil {
				t.Fatal(err)
			}
			pkt.DecRef()
			want = append(want, first+i)
		}
		waitParked(t, q)
	}
	for b := range byte(5) {
		burst(b * 3)
	}
	if n := q.started.Load(); n != 1 {
		t.Fatalf("five bursts with a bulk flow open started %d writers, want 1", n)
	}
	small := smallPacket(15) // written by its sender, the writer waiting
	if err := q.WritePacket(small); err != nil {
		t.Fatal(err)
	}
	small.DecRef()
	want = append(want, 15)
	if n := q.inlined.Load(); n != 1 {
		t.Fatalf("%d packets written inline, want the small one", n)
	}
	burst(16)
	if n := q.started.Load(); n != 1 {
		t.Fatalf("a burst after an inline write started %d writers in all, want 1", n)
	}
	if got := w.got(); string(got) != string(want) {
		t.Fatalf("the link got %v, want %v", got, want)
	}

	q.leave() // one flow still open: the writer stays
	if !isParked(q) {
		t.Fatal("the writer ended with a bulk flow still open")
	}
	q.leave()
	waitEnded(t, q)
	for b := range byte(2) { // no flow open: a writer per burst
		pkt := onePacket(20 + b)
		if err := q.WritePacket(pkt); err != nil {
			t.Fatal(err)
		}
		pkt.DecRef()
		waitEnded(t, q)
	}
	if n := q.started.Load(); n != 3 {
		t.Fatalf("%d writers started in all, want 3 (one per burst once the flows left)", n)
	}

	q.stay()
	pkt := onePacket(30)
	if err := q.WritePacket(pkt); err != nil {
		t.Fatal(err)
	}
	pkt.DecRef()
	waitParked(t, q)
	closed := make(chan struct{})
	go func() { q.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the waiting writer")
	}
}

func isParked(q *sendQueue) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.parked
}

// waitParked waits until q's writer has written everything and waits.
func waitParked(t *testing.T, q *sendQueue) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if isParked(q) {
			return
		}
	}
	t.Fatal("the writer not waiting after 10 s")
}

// waitEnded waits until q has no goroutine left: no writer, waiting or
// writing.
func waitEnded(t *testing.T, q *sendQueue) {
	t.Helper()
	ended := make(chan struct{})
	go func() { q.wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the queue's writer still there after 10 s")
	}
}
