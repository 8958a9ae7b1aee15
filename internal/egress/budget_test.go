package egress_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

// endedWithin reads c until it ends (an error other than its deadline)
// and reports whether it did before d passed.
func endedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 64<<10)
	for {
		if _, err := c.Read(buf); err != nil {
			var ne net.Error
			return !(errors.As(err, &ne) && ne.Timeout())
		}
	}
}

// A flow open when EndFlows runs is reset.
func TestEndFlowsEndsOpenFlow(t *testing.T) {
	e := newEnv(t, policy.Spec{AllowAll: true}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.sb.DialTCP(ctx, ap("198.51.100.1:19"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1)
	if _, err := c.Read(buf); err != nil {
		t.Fatalf("the flow before EndFlows: %v", err)
	}
	e.st.EndFlows()
	if !endedWithin(c, 10*time.Second) {
		t.Fatal("the flow went on after EndFlows")
	}
}

// A flow admitted before its sandbox's day was spent, and tracked only
// after the EndFlows that followed (its upstream was being dialled
// meanwhile), is ended too: it is admitted again once tracked.
func TestEndFlowsDuringDial(t *testing.T) {
	var spent atomic.Bool
	var e *env
	e = newEnv(t, policy.Spec{AllowAll: true}, func(o *egress.Options) {
		o.Admit = func() string {
			if spent.Load() {
				return egress.ReasonEgressSpent
			}
			return ""
		}
		dial := o.Dial
		o.Dial = func(ctx context.Context, network, address string) (net.Conn, error) {
			// Another flow of the team ends now and spends its day.
			spent.Store(true)
			e.st.EndFlows()
			return dial(ctx, network, address)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.sb.DialTCP(ctx, ap("198.51.100.1:19"))
	if err != nil {
		return // refused: the day is spent
	}
	defer c.Close()
	if !endedWithin(c, 10*time.Second) {
		t.Fatal("a flow admitted while the day was being spent went on after it was")
	}
	evs := e.waitEvents(t, "tcp", 1)
	if len(evs) != 1 || evs[0].Reason != egress.ReasonEgressSpent {
		t.Errorf("flows recorded = %+v, want one ended for %s", evs, egress.ReasonEgressSpent)
	}
}
