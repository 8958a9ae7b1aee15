package egress_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/metrics"
	"strings"
	"syscall"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/fencesandbox/fence/internal/egress"
)

// slowSYNACKLink is the stack's end of the link to the sandbox, whose
// write of a SYN-ACK returns only hold after handing it over, as a write
// to a TUN device returns only once the sandbox's kernel has handled the
// packet (and answered it).
type slowSYNACKLink struct {
	nested.Endpoint
	hold time.Duration
}

func (l *slowSYNACKLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	n, err := l.Endpoint.WritePackets(pkts)
	for _, pkt := range pkts.AsSlice() {
		h := header.TCP(pkt.TransportHeader().Slice())
		if pkt.TransportProtocolNumber == header.TCPProtocolNumber && len(h) >= header.TCPMinimumSize &&
			h.Flags().Contains(header.TCPFlagSyn|header.TCPFlagAck) {
			time.Sleep(l.hold)
		}
	}
	return n, err
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestSYNACKWriteDoesNotSpin: while the stack's write of a SYN-ACK is
// under way, the sandbox's answer to it costs the daemon nothing. The
// stack used to write it holding the new endpoint's lock, and gVisor's
// TCP processor, given the sandbox's ACK meanwhile, retried the locked
// endpoint without pause until the write returned: here, with writes
// held 20 ms, 107 to 191 ms of CPU for 10 connections in three runs,
// against 5 to 16 ms now (30 to 51 ms under the race detector). A spin
// grows with the holds and the rest does not: with writes held 50 ms the
// bound, a quarter of the holds' total, is 125 ms.
func TestSYNACKWriteDoesNotSpin(t *testing.T) {
	const conns, hold = 10, 50 * time.Millisecond
	e := newEnv(t, cidrSpec, func(o *egress.Options) {
		l := &slowSYNACKLink{hold: hold}
		l.Endpoint.Init(o.Link, l)
		o.Link = l
	})
	start := cpuTime()
	for range conns {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := e.sb.DialTCP(ctx, ap("203.0.113.1:9"))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	used := cpuTime() - start
	t.Logf("%d connections, SYN-ACK writes held %v each: %v of CPU", conns, hold, used)
	if used > conns*hold/4 {
		t.Errorf("%v of CPU for %d connections whose SYN-ACK writes took %v each: the stack spins while they are under way", used, conns, hold)
	}
}

// TestSYNACKWrittenBySender: with the send queue idle, a new connection's
// SYN-ACK is written by the goroutine that completes the handshake,
// without starting the queue's writer for it (each connection's SYN-ACK
// was queued, and its writer started and given a CPU, before the
// sandbox could answer). The sandbox's answer, given during the write,
// still completes the handshake.
func TestSYNACKWrittenBySender(t *testing.T) {
	const conns = 20
	e := newEnv(t, cidrSpec, nil)
	n0 := egress.SYNsInline(e.st)
	for range conns {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := e.sb.DialTCP(ctx, ap("203.0.113.1:9"))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	// A SYN-ACK finding the queue busy (a previous connection's last
	// acknowledgement being written) is queued: most are not.
	if n := egress.SYNsInline(e.st) - n0; n < conns/2 {
		t.Errorf("%d of %d SYN-ACKs written by their sender, want most", n, conns)
	}
}

// TestClosedFlowTimers: a flow the stack closed first ends its TIME-WAIT
// before the retransmission timer of its last segments would fire, and
// that timer, left armed by gVisor once those segments are acknowledged,
// is stopped with the endpoint instead of starting a goroutine of its
// own: per connection closed, one timer goroutine (TIME-WAIT's end)
// where there were two. Counted over the 1.5 s after the connections, in
// a process of its own (this test binary again) so that nothing else
// starts goroutines meanwhile.
func TestClosedFlowTimers(t *testing.T) {
	const conns = 40
	if os.Getenv("EGRESS_TIMERS_CHILD") == "1" {
		closedFlowTimers(t, conns)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestClosedFlowTimers$", "-test.v")
	cmd.Env = append(os.Environ(), "EGRESS_TIMERS_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the counting process: %v\n%s", err, out)
	}
	var per float64
	i := strings.Index(string(out), "per closed connection: ")
	if i < 0 {
		t.Fatalf("no count in the counting process's output:\n%s", out)
	}
	fmt.Sscan(string(out[i+len("per closed connection: "):]), &per)
	t.Logf("goroutines started per closed connection in the 1.5 s after: %.2f", per)
	if per > 1.5 {
		t.Errorf("%.2f goroutines started per closed connection after it ended, want 1 or fewer (its TIME-WAIT's end)", per)
	}
}

// closedFlowTimers makes conns connections the upstream closes first and
// logs the goroutines the process starts per connection in the 1.5 s
// after them.
func closedFlowTimers(t *testing.T, conns int) {
	e := newEnv(t, cidrSpec, nil)
	for range conns {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := e.sb.DialTCP(ctx, ap("203.0.113.1:80"))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		io.Copy(io.Discard, c) // the upstream closes first, then the stack
		c.Close()
	}
	g0 := goroutinesCreated()
	time.Sleep(1500 * time.Millisecond)
	t.Logf("per closed connection: %.2f", float64(goroutinesCreated()-g0)/float64(conns))
}

func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
