package egress

import (
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// TestGrowSendCharged: a full flow's larger send buffer is charged to the
// sandbox's share when it is given, given only if the part of the share
// for full flows can pay for it, never to a small flow, and returned with
// the flow.
func TestGrowSendCharged(t *testing.T) {
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol},
	})
	defer s.Close()
	var wq waiter.Queue
	ep, err := s.NewEndpoint(tcp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	extra := int64(bulkSendBufSize - flowBufMax)
	for _, tt := range []struct {
		name  string
		share int64
		grows bool
	}{
		{"room", 2 * (fullFlowCost + extra), true},
		{"no room", 2 * fullFlowCost, false},
	} {
		sh := NewShared(SharedOptions{Share: tt.share, Floor: 1})
		st := &Stack{opts: Options{Shared: sh}, acct: account{s: sh}, slots: make(chan struct{}, 4)}
		fl, ok := st.acquireFlow()
		if !ok || fl.small {
			t.Fatalf("%s: acquireFlow = %v, small %v; want a full flow", tt.name, ok, fl != nil && fl.small)
		}
		before := ep.SocketOptions().GetSendBufferSize()
		fl.growSend(ep)
		fl.growSend(ep) // once only
		got := sh.Stats().Reserved
		if tt.grows {
			if got != fullFlowCost+extra || ep.SocketOptions().GetSendBufferSize() != bulkSendBufSize {
				t.Errorf("%s: reserved %d, send buffer %d; want %d and %d", tt.name, got, ep.SocketOptions().GetSendBufferSize(), fullFlowCost+extra, bulkSendBufSize)
			}
		} else if got != fullFlowCost || ep.SocketOptions().GetSendBufferSize() != before {
			t.Errorf("%s: reserved %d, send buffer %d; want %d and unchanged %d", tt.name, got, ep.SocketOptions().GetSendBufferSize(), fullFlowCost, before)
		}
		fl.release()
		fl.growSend(ep) // after release: nothing
		if r := sh.Stats().Reserved; r != 0 {
			t.Errorf("%s: %d bytes still reserved after release", tt.name, r)
		}
		ep.SocketOptions().SetSendBufferSize(before, true)
	}
	// A small flow never grows.
	sh := NewShared(SharedOptions{Share: smallFlowCost, Floor: 1})
	st := &Stack{opts: Options{Shared: sh}, acct: account{s: sh}, slots: make(chan struct{}, 4)}
	fl, ok := st.acquireFlow()
	if !ok || !fl.small {
		t.Fatalf("acquireFlow with a small share = %v; want a small flow", ok)
	}
	fl.growSend(ep)
	if r := sh.Stats().Reserved; r != smallFlowCost {
		t.Errorf("small flow: reserved %d after growSend, want %d", r, smallFlowCost)
	}
	fl.release()
}

// TestBulkFlowKeepsTheWriter: a flow that has moved bulkAfter bytes
// towards the sandbox keeps the send queue's writer once, however often
// it is told, and gives it back with its release, after which it keeps
// nothing.
func TestBulkFlowKeepsTheWriter(t *testing.T) {
	sh := NewShared(SharedOptions{})
	q := newSendQueue(newHeldWriter())
	defer q.Close()
	st := &Stack{opts: Options{Shared: sh}, acct: account{s: sh}, slots: make(chan struct{}, 4), sendQ: q}
	stays := func() int {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.stays
	}
	a, _ := st.acquireFlow()
	b, _ := st.acquireFlow()
	a.keepWriter()
	a.keepWriter()
	b.keepWriter()
	if n := stays(); n != 2 {
		t.Fatalf("two bulk flows hold %d stays, want 2", n)
	}
	a.release()
	a.release()
	if n := stays(); n != 1 {
		t.Fatalf("%d stays after one flow's release, want 1", n)
	}
	a.keepWriter() // after its release: nothing
	b.release()
	if n := stays(); n != 0 {
		t.Fatalf("%d stays after both flows' release, want 0", n)
	}
}
