package egress

import (
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// sendQueue is the NIC's queueing discipline: the stack's packets to the
// sandbox are queued, and a goroutine of the queue's own writes them to
// the link. A write to the sandbox's TUN device is the heaviest step of a
// download: the packet is copied into the sandbox's kernel, which receives
// it (TCP, its socket, the wake-up of its reader) inside the write. Made
// on the stack's goroutines (gVisor's default), it runs in series with
// the relay that reads the upstream and hands the bytes to the stack: a
// download then left about a third of two CPUs idle. On the queue's
// goroutine the two run side by side.
//
// A SYN (a SYN-ACK to the sandbox, mostly) is written by its sender only
// when the queue has a deliveryHolder (the stack's filterEndpoint): its
// sender holds the new endpoint's lock, and the sandbox's kernel answers
// a SYN-ACK inside the write to its device; given to gVisor's TCP
// processor while the lock was held, that answer made it spin until the
// write returned. The holder keeps what the sandbox sends during the
// write and delivers it once the write has ended. Queued instead, each
// new connection's SYN-ACK started the queue's goroutine and waited for
// it to be given a CPU, on the path of every connection.
//
// A small packet (at most inlineMax bytes; not a TCP SYN, nor a bare
// acknowledgement) that finds the queue empty and no writer running is
// written on the caller's goroutine instead: a request's or an answer's
// few bytes, a FIN or a RST, a DNS answer. Starting the writer for it cost
// a goroutine and, with a CPU idle, the wake-up of a thread, which is
// longer than the write itself and lay on the path of every exchange of
// small messages (a new connection's first bytes, each answer). Bare
// acknowledgements stay queued: during an upload gVisor's TCP processor
// sends one after another, and writing them itself put the sandbox's
// kernel's handling of each (which wakes its sender) in series with the
// processor's work, for more context switches per byte
// (BenchmarkTUNUpload). While it is written the queue counts as
// writing: packets that come meanwhile are queued behind it and written by
// a writer started after it, so the order holds. Large segments, a bulk
// flow's, always go through the queue.
//
// An idle queue holds no goroutine: one is started when a packet arrives
// at an empty queue and ends once it has written all there was, unless a
// bulk flow is open (stay, leave): while one is, the writer that finds the
// queue empty waits for the next packet instead of ending, and the next
// packet wakes it. A download's segments come in bursts (what the relay
// hands the stack at once, or what an acknowledgement lets the stack
// send), and a writer ended after each burst was started again for the
// next: a goroutine started, its stack grown and a thread woken about once
// per MiB (BenchmarkTUNDownload's goroutines/MB). The last bulk flow
// that leaves ends a waiting writer. (gVisor's
// fifo discipline keeps a goroutine and a 1,000-entry ring per NIC for the
// stack's whole life, about 16 KiB for every idle sandbox.) At most
// maxQueued packets wait; past that a packet is refused, as by a full
// device queue (TCP sends it again). A queued TCP segment shares its
// bytes with the sender's retransmission queue, so queueing it holds
// little more than the segment's header.
type sendQueue struct {
	lower stack.LinkWriter

	mu sync.Mutex
	// +checklocks:mu
	pkts []*stack.PacketBuffer
	// +checklocks:mu
	writing bool // a writer goroutine runs, or a sender writes inline
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	stays int // bulk flows open (stay, leave)
	// +checklocks:mu
	parked bool // the writer waits on wake for packets (only while stays > 0)

	// wake wakes a parked writer. Whoever wakes it clears parked and sets
	// writing, so that no second writer starts before it runs again.
	wake chan struct{}

	wg sync.WaitGroup // the writer, or a sender writing inline

	inlined   atomic.Int64 // packets written on their sender's goroutine
	started   atomic.Int64 // writer goroutines started
	synInline atomic.Int64 // SYNs written inline, deliveries held

	// holder, if set, holds the sandbox's packets while a SYN is
	// written inline.
	holder deliveryHolder
}

// deliveryHolder holds the deliveries of the sandbox's packets between
// holdDeliveries and releaseDeliveries (filterEndpoint).
type deliveryHolder interface {
	holdDeliveries()
	releaseDeliveries()
}

var _ stack.QueueingDiscipline = (*sendQueue)(nil)

// maxQueued bounds the packets waiting in a sendQueue: a bulk flow's send
// buffer of the largest segments (32) for many flows at once. The device
// takes every write at once (the sandbox's kernel receives the packet
// inside it), so the queue only grows while its writer waits for a CPU.
const maxQueued = 1024

// writeBatch is how many queued packets the writer takes at a time.
const writeBatch = 64

// inlineMax is the largest packet (its headers and payload) a sender
// writes itself to an idle queue; see sendQueue.
const inlineMax = 2048

func newSendQueue(lower stack.LinkWriter) *sendQueue {
	return &sendQueue{lower: lower, wake: make(chan struct{}, 1)}
}

// WritePacket implements stack.QueueingDiscipline: pkt is queued (the
// queue holds a reference) and written by the queue's goroutine, or, small
// and finding the queue idle, written at once on the caller's.
func (q *sendQueue) WritePacket(pkt *stack.PacketBuffer) tcpip.Error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return &tcpip.ErrClosedForSend{}
	}
	if len(q.pkts) >= maxQueued {
		q.mu.Unlock()
		return &tcpip.ErrNoBufferSpace{}
	}
	if !q.writing {
		if syn := isSYN(pkt); (syn && q.holder != nil && pkt.Size() <= inlineMax) || (!syn && inline(pkt)) {
			// Nothing queued (a writer ends only on an empty queue).
			q.writing = true
			q.wg.Add(1)
			q.mu.Unlock()
			q.writeInline(pkt, syn)
			return nil
		}
	}
	q.pkts = append(q.pkts, pkt.IncRef())
	if !q.writing {
		q.writing = true
		if !q.wakeLocked() {
			q.wg.Add(1)
			q.started.Add(1)
			go q.write()
		}
	}
	q.mu.Unlock()
	return nil
}

// wakeLocked wakes a parked writer, if there is one, which then counts as
// writing: the caller has set q.writing or is about to end the queue.
//
// +checklocks:q.mu
func (q *sendQueue) wakeLocked() bool {
	if !q.parked {
		return false
	}
	q.parked = false
	q.writing = true
	q.wake <- struct{}{} // buffered: the one parked writer takes it
	return true
}

// stay keeps the queue's writer while a bulk flow is open: a writer that
// finds the queue empty waits for the next packet instead of ending. Each
// stay is undone by one leave.
func (q *sendQueue) stay() {
	q.mu.Lock()
	q.stays++
	q.mu.Unlock()
}

// leave undoes a stay; the last one ends a writer that waits.
func (q *sendQueue) leave() {
	q.mu.Lock()
	q.stays--
	if q.stays == 0 {
		q.wakeLocked() // it finds nothing to write and ends
	}
	q.mu.Unlock()
}

// isSYN reports whether pkt is a TCP SYN (or SYN-ACK).
func isSYN(pkt *stack.PacketBuffer) bool {
	if pkt.TransportProtocolNumber != header.TCPProtocolNumber {
		return false
	}
	tcp := header.TCP(pkt.TransportHeader().Slice())
	return len(tcp) >= header.TCPMinimumSize && tcp.Flags()&header.TCPFlagSyn != 0
}

// inline reports whether pkt may be written on its sender's goroutine
// without holding deliveries: a small packet that is not a TCP SYN (whose
// sender holds the new endpoint's lock) nor a bare acknowledgement.
func inline(pkt *stack.PacketBuffer) bool {
	if pkt.Size() > inlineMax {
		return false
	}
	if pkt.TransportProtocolNumber == header.TCPProtocolNumber {
		tcp := header.TCP(pkt.TransportHeader().Slice())
		if len(tcp) < header.TCPMinimumSize || tcp.Flags()&header.TCPFlagSyn != 0 {
			return false
		}
		if tcp.Flags() == header.TCPFlagAck && pkt.Data().Size() == 0 {
			return false
		}
	}
	return true
}

// writeInline writes pkt to the link on the caller's goroutine, the queue
// marked as writing (by the caller) so that what comes meanwhile waits
// behind it; it then hands what came to a writer, or marks the queue
// idle. A SYN is written with the sandbox's deliveries held.
func (q *sendQueue) writeInline(pkt *stack.PacketBuffer, syn bool) {
	var batch stack.PacketBufferList
	batch.PushBack(pkt.IncRef())
	if syn {
		q.holder.holdDeliveries()
	}
	q.lower.WritePackets(batch) // a packet the link refuses is dropped
	if syn {
		q.holder.releaseDeliveries()
		q.synInline.Add(1)
	}
	batch.Reset()
	q.inlined.Add(1)
	q.mu.Lock()
	if len(q.pkts) > 0 && !q.closed {
		if q.wakeLocked() {
			q.mu.Unlock()
			q.wg.Done()
			return
		}
		q.started.Add(1)
		go q.write() // takes over q.wg's count and writing
		q.mu.Unlock()
		return
	}
	q.writing = false
	q.mu.Unlock()
	q.wg.Done()
}

// write writes the queued packets in order, in batches, until the queue
// is closed, or empty with no bulk flow open; empty with one open, it
// waits for the next packet.
func (q *sendQueue) write() {
	defer q.wg.Done()
	var batch stack.PacketBufferList
	for {
		q.mu.Lock()
		if q.closed || (len(q.pkts) == 0 && q.stays == 0) {
			q.writing = false
			if len(q.pkts) == 0 && cap(q.pkts) > writeBatch {
				q.pkts = nil // an idle sandbox keeps no burst's backlog array
			}
			q.mu.Unlock()
			return
		}
		if len(q.pkts) == 0 {
			q.writing = false
			q.parked = true
			q.mu.Unlock()
			<-q.wake // writing again, or told to end
			continue
		}
		n := min(len(q.pkts), writeBatch)
		for i, pkt := range q.pkts[:n] {
			batch.PushBack(pkt)
			q.pkts[i] = nil
		}
		if n == len(q.pkts) {
			q.pkts = q.pkts[:0]
		} else {
			q.pkts = append(q.pkts[:0], q.pkts[n:]...)
		}
		q.mu.Unlock()
		q.lower.WritePackets(batch) // a packet the link refuses is dropped
		batch.Reset()               // drops the queue's references
	}
}

// Close implements stack.QueueingDiscipline: it refuses further packets,
// waits for a write under way, and drops what is still queued.
func (q *sendQueue) Close() {
	q.mu.Lock()
	q.closed = true
	q.wakeLocked()
	q.mu.Unlock()
	q.wg.Wait()
	q.mu.Lock()
	pkts := q.pkts
	q.pkts = nil
	q.mu.Unlock()
	for _, pkt := range pkts {
		pkt.DecRef()
	}
}
