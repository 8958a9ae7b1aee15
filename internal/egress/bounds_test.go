package egress_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

// eventually polls cond every 5 ms for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not true after 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRefusedFlood floods refused connection attempts: within the
// refused rate each gets a RST and an event; over it, attempts are
// dropped and counted, and the count reaches the recorder (with a later
// event, at the latest when the stack closes). Nothing is dialed.
func TestRefusedFlood(t *testing.T) {
	sh := egress.NewShared(egress.SharedOptions{})
	e := newEnv(t, policy.Spec{}, func(o *egress.Options) { o.Shared, o.RefusedRate = sh, 10 })
	const n = 200
	var wg sync.WaitGroup
	var refused sync.Map
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			c, err := e.sb.DialTCP(ctx, netip.AddrPortFrom(netip.MustParseAddr("203.0.113.1"), uint16(1000+i)))
			if err == nil {
				c.Close()
				t.Errorf("dial to a refused address succeeded")
				return
			}
			if !errors.Is(err, context.DeadlineExceeded) && !isTimeoutErr(err) {
				refused.Store(i, true) // a RST, not a dropped SYN
			}
		})
	}
	wg.Wait()
	got := sh.Stats()
	nRST := 0
	refused.Range(func(any, any) bool { nRST++; return true })
	t.Logf("%d attempts: %d refused with RST, %d dropped over the rate", n, got.Refused, got.SYNLimited)
	if got.Refused+got.SYNLimited < n {
		t.Errorf("Refused %d + SYNLimited %d < %d attempts", got.Refused, got.SYNLimited, n)
	}
	// Burst 20, 10/s for well under a second.
	if got.Refused > 30 || int64(nRST) > got.Refused {
		t.Errorf("Refused = %d (RSTs seen %d), want at most the burst of 20 plus a few", got.Refused, nRST)
	}
	e.st.Close()
	var events, suppressed int64
	for _, ev := range e.rec.Events() {
		if ev.Proto != "tcp" || ev.Allowed {
			t.Errorf("unexpected event %+v", ev)
		}
		if ev.Reason != egress.ReasonRateLimit {
			events++
		}
		suppressed += ev.Suppressed
	}
	if events != got.Refused || suppressed != got.SYNLimited {
		t.Errorf("events: %d refusals carrying %d suppressed; want %d and %d", events, suppressed, got.Refused, got.SYNLimited)
	}
	if d := e.dialed(); len(d) != 0 {
		t.Errorf("dialed %v, want nothing", d)
	}
}

func isTimeoutErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestFlowBudget opens flows until the sandbox's share is spent: the
// first ones are charged as full flows up to half the share, the next as
// small ones, and the one after is refused; closing them returns the
// memory.
func TestFlowBudget(t *testing.T) {
	share := int64(4 * egress.FullFlowCost)
	sh := egress.NewShared(egress.SharedOptions{Share: share})
	e := newEnv(t, cidrSpec, func(o *egress.Options) { o.Shared = sh })
	want := 2 + int((share-2*egress.FullFlowCost)/egress.SmallFlowCost)
	var open []net.Conn
	for i := range want + 1 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := e.sb.DialTCP(ctx, ap("203.0.113.1:9"))
		cancel()
		if i == want {
			if err == nil {
				c.Close()
				t.Errorf("flow %d beyond the share was accepted", i)
			}
			break
		}
		if err != nil {
			t.Fatalf("flow %d of %d within the share: %v", i, want, err)
		}
		open = append(open, c)
	}
	if got, w := sh.Stats().Reserved, int64(2*egress.FullFlowCost+(want-2)*egress.SmallFlowCost); got != w {
		t.Errorf("Reserved = %d, want %d", got, w)
	}
	if sh.Stats().BudgetRefused != 1 {
		t.Errorf("BudgetRefused = %d, want 1", sh.Stats().BudgetRefused)
	}
	for _, c := range open {
		c.Close()
	}
	eventually(t, "flow memory returned", func() bool { return sh.Stats().Reserved == 0 })
}

// TestBudgetFloor spends the daemon-wide budget from one sandbox and
// checks that another can still open flows within its floor.
func TestBudgetFloor(t *testing.T) {
	sh := egress.NewShared(egress.SharedOptions{Budget: 2 * egress.FullFlowCost, Share: 16 * egress.FullFlowCost, Floor: 2 * egress.SmallFlowCost})
	greedy := newEnv(t, cidrSpec, func(o *egress.Options) { o.Shared = sh })
	other := newEnv(t, cidrSpec, func(o *egress.Options) { o.Shared = sh })
	dial := func(e *env) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return e.sb.DialTCP(ctx, ap("203.0.113.1:9"))
	}
	n := 0
	for ; n < 100; n++ {
		c, err := dial(greedy)
		if err != nil {
			break
		}
		defer c.Close()
	}
	if n == 100 {
		t.Fatalf("the greedy sandbox opened %d flows on a budget of two", n)
	}
	for i := range 2 {
		c, err := dial(other)
		if err != nil {
			t.Fatalf("flow %d of the other sandbox within its floor: %v", i, err)
		}
		defer c.Close()
	}
	t.Logf("greedy sandbox: %d flows; the other still opened 2 within its floor", n)
}

// TestDNSTCPBounds opens more DNS-over-TCP connections than a sandbox may
// hold: the extra ones are closed at once, the others stay open.
func TestDNSTCPBounds(t *testing.T) {
	e := newEnv(t, allowList, nil)
	var conns []net.Conn
	for range egress.MaxDNSConns + 4 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := e.sb.DialTCP(ctx, netip.AddrPortFrom(egress.ResolverIPv4, 53))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	var closed atomic.Int32
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeoutErr(err) {
				closed.Add(1)
			}
		})
	}
	wg.Wait()
	if n := closed.Load(); n != 4 {
		t.Errorf("%d of %d DNS-over-TCP connections closed by the stack, want 4", n, len(conns))
	}
}

// TestDNSRate sends a burst of queries over UDP: those over the sandbox's
// query rate are dropped and counted.
func TestDNSRate(t *testing.T) {
	sh := egress.NewShared(egress.SharedOptions{})
	e := newEnv(t, allowList, func(o *egress.Options) { o.Shared, o.DNSRate = sh, 5 })
	c, err := e.sb.DialUDP(netip.AddrPortFrom(egress.ResolverIPv4, 53))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 60
	for i := range n {
		q := new(mdns.Msg)
		q.SetQuestion("allowed.test.", mdns.TypeA)
		q.Id = uint16(i)
		b, _ := q.Pack()
		c.Write(b)
	}
	answers := 0
	buf := make([]byte, 1500)
	for {
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Read(buf); err != nil {
			break
		}
		answers++
	}
	limited := sh.Stats().DNSLimited
	t.Logf("%d queries: %d answered, %d limited", n, answers, limited)
	if answers > 20 || limited < n-20 {
		t.Errorf("%d of %d queries answered (%d limited) at 5/s with a burst of 10, want at most 20", answers, n, limited)
	}
}
