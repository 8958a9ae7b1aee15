package egress_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/fencesandbox/fence/internal/egress"
)

// stallLink is the stack's end of the link to the sandbox as a busy
// machine makes it: the sandbox's packets reach the stack in order, but
// every stallEvery-th one (and what follows it meanwhile) only after
// stallFor, as when the daemon's reader or the sandbox waits for a CPU.
// It records the TCP data segments the stack sends, to find those sent
// twice.
type stallLink struct {
	nested.Endpoint
	stallEvery int
	stallFor   time.Duration
	dropEvery  int // drop every dropEvery-th new data segment (0: none)

	mu sync.Mutex
	// +checklocks:mu
	n int
	// +checklocks:mu
	q []*stack.PacketBuffer
	// +checklocks:mu
	sent map[[2]uint32]int // {seq, len} → times sent
	// +checklocks:mu
	flushing bool
	// +checklocks:mu
	lost [][2]uint32 // {seq, len} of the dropped segments not yet sent again
	// +checklocks:mu
	next uint32 // the sequence number after the highest data sent
	// +checklocks:mu
	sentAny bool
	// +checklocks:mu
	first uint32 // the first data segment's sequence number
	// +checklocks:mu
	drops  [][2]uint32 // every dropped segment
	protos map[*stack.PacketBuffer]tcpip.NetworkProtocolNumber
}

func newStallLink(child stack.LinkEndpoint, every int, d time.Duration) *stallLink {
	l := &stallLink{stallEvery: every, stallFor: d, sent: map[[2]uint32]int{}, protos: map[*stack.PacketBuffer]tcpip.NetworkProtocolNumber{}}
	l.Endpoint.Init(child, l)
	return l
}

// DeliverNetworkPacket implements stack.NetworkDispatcher: the sandbox's
// packets, towards the stack.
func (l *stallLink) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	l.mu.Lock()
	l.n++
	if !l.flushing && (l.n%l.stallEvery != 0) && len(l.q) == 0 {
		l.mu.Unlock()
		l.Endpoint.DeliverNetworkPacket(proto, pkt)
		return
	}
	pkt.IncRef()
	l.q = append(l.q, pkt)
	l.protos[pkt] = proto
	if !l.flushing {
		l.flushing = true
		time.AfterFunc(l.stallFor, l.flush)
	}
	l.mu.Unlock()
}

func (l *stallLink) flush() {
	for {
		l.mu.Lock()
		if len(l.q) == 0 {
			l.flushing = false
			l.mu.Unlock()
			return
		}
		pkt := l.q[0]
		l.q = l.q[1:]
		proto := l.protos[pkt]
		delete(l.protos, pkt)
		l.mu.Unlock()
		l.Endpoint.DeliverNetworkPacket(proto, pkt)
		pkt.DecRef()
	}
}

// WritePackets implements stack.LinkWriter: the stack's packets, towards
// the sandbox.
func (l *stallLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	var pass stack.PacketBufferList
	l.mu.Lock()
	for _, pkt := range pkts.AsSlice() {
		if pkt.TransportProtocolNumber == header.TCPProtocolNumber && pkt.Data().Size() > 0 {
			th := header.TCP(pkt.TransportHeader().Slice())
			k := [2]uint32{th.SequenceNumber(), uint32(pkt.Data().Size())}
			l.sent[k]++
			// A re-send need not start where the lost segment did, nor
			// be as long: any segment over the lost one's first byte
			// repairs it.
			l.lost = slices.DeleteFunc(l.lost, func(d [2]uint32) bool { return covers(k, d[0]) })
			// Only new data is dropped: a re-send of data the sandbox
			// already has may be lost without harm.
			fresh := !l.sentAny || int32(k[0]-l.next) >= 0
			if !l.sentAny {
				l.first = k[0]
			}
			if end := k[0] + k[1]; !l.sentAny || int32(end-l.next) > 0 {
				l.next, l.sentAny = end, true
			}
			if fresh && l.dropEvery > 0 && l.sent[k] == 1 && len(l.sent)%l.dropEvery == 0 {
				l.lost = append(l.lost, k)
				l.drops = append(l.drops, k)
				continue
			}
		}
		pass.PushBack(pkt)
	}
	l.mu.Unlock()
	if _, err := l.Endpoint.WritePackets(pass); err != nil {
		return 0, err
	}
	return pkts.Len(), nil
}

// covers reports whether the segment {seq, len} holds sequence number x
// (modulo 2^32).
func covers(seg [2]uint32, x uint32) bool { return x-seg[0] < seg[1] }

// resent counts the data segments sent more than once.
func (l *stallLink) resent() (n, segs int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range l.sent {
		if k > 1 {
			n += k - 1
		}
	}
	return n, len(l.sent)
}

// TestNoSpuriousRetransmitOnStall: the sandbox's acknowledgements held
// back for 30 ms now and then (a loaded machine's scheduling, far below
// the retransmission timeout's 200 ms floor) make the stack re-send
// nothing: nothing was lost. With RACK and tail loss probes, whose timers
// were twice the smoothed RTT of a link of memory (microseconds), each
// stall re-sent segments the sandbox already had.
func TestNoSpuriousRetransmitOnStall(t *testing.T) {
	var link *stallLink
	e := newEnv(t, cidrSpec, func(o *egress.Options) {
		link = newStallLink(o.Link, 40, 30*time.Millisecond)
		o.Link = link
	})
	download(t, e, 32<<20)
	n, segs := link.resent()
	t.Logf("%d data segments, %d sent again", segs, n)
	if n > 0 {
		t.Errorf("the stack sent %d data segments again although none was lost", n)
	}
}

// TestLossRepairedWithoutRACK: segments the sandbox's kernel drops are
// still re-sent (SACK recovery, the retransmission timer) and the
// download completes.
func TestLossRepairedWithoutRACK(t *testing.T) {
	var link *stallLink
	e := newEnv(t, cidrSpec, func(o *egress.Options) {
		link = newStallLink(o.Link, 1<<30, 0)
		link.dropEvery = 50
		o.Link = link
	})
	const size = 32 << 20
	download(t, e, size)
	n, segs := link.resent()
	// The server streams on; what was dropped past the bytes the
	// download read needs no repair.
	link.mu.Lock()
	needed := func(segs [][2]uint32) (k int) {
		for _, d := range segs {
			if d[0]-link.first < size { // +checklocksignore: a closure made under link.mu
				k++
			}
		}
		return k // +checklocksignore: a closure made under link.mu
	}
	dropped, unrepaired := needed(link.drops), needed(link.lost)
	link.mu.Unlock()
	t.Logf("%d data segments, %d dropped within the download, %d sent again at the same sequence and length", segs, dropped, n)
	if dropped == 0 || unrepaired > 0 {
		t.Errorf("%d segments dropped within the download, %d of them never sent again", dropped, unrepaired)
	}
}
