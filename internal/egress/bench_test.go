package egress_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

var cidrSpec = policy.Spec{Allow: []policy.Rule{{Prefix: netip.MustParsePrefix("203.0.113.0/24")}}}

// BenchmarkUpload measures sandbox → upstream throughput through the
// in-process harness (sandbox netstack → egress netstack → 127.0.0.1).
// Both netstacks run on the same CPUs, so this is a lower bound of what a
// TUN with the kernel on the sandbox side gives.
func BenchmarkUpload(b *testing.B) {
	e := newEnv(b, cidrSpec, nil)
	c, err := e.sb.DialTCP(context.Background(), ap("203.0.113.1:9"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDownload measures upstream → sandbox throughput.
func BenchmarkDownload(b *testing.B) {
	e := newEnv(b, cidrSpec, nil)
	c, err := e.sb.DialTCP(context.Background(), ap("203.0.113.1:19"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConnect measures a sandbox connect through the stack (decide,
// dial upstream on 127.0.0.1, complete the handshake) and close.
func BenchmarkConnect(b *testing.B) {
	e := newEnv(b, cidrSpec, unlimitedRates)
	b.ReportAllocs()
	for range b.N {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := e.sb.DialTCP(ctx, ap("203.0.113.1:9"))
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// BenchmarkConnectByName is BenchmarkConnect for a name-verified flow up
// to the first byte reaching the upstream (HTTP request, response).
func BenchmarkConnectByName(b *testing.B) {
	e := newEnv(b, allowList, unlimitedRates)
	if as := e.lookup(b, "allowed.test"); len(as) == 0 {
		b.Fatal("lookup failed")
	}
	b.ReportAllocs()
	for range b.N {
		if _, err := e.get(b, ap("203.0.113.10:80"), "allowed.test"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDownloadDirect is BenchmarkDownload's transfer made from the
// host itself, straight to the same upstream over loopback: the peer
// figure the stack's throughput is compared with in the same run.
func BenchmarkDownloadDirect(b *testing.B) {
	e := newEnv(b, cidrSpec, nil)
	c, err := net.Dial("tcp", e.ups[19].l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConnectDirect is BenchmarkConnect made from the host: the
// difference is what the stack adds per connection.
func BenchmarkConnectDirect(b *testing.B) {
	e := newEnv(b, cidrSpec, nil)
	addr := e.ups[9].l.Addr().String()
	b.ReportAllocs()
	for range b.N {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// unlimitedRates lifts the per-sandbox rates, which a benchmark's loop of
// connections would otherwise measure instead of the stack.
func unlimitedRates(o *egress.Options) {
	o.NewFlowRate, o.RefusedRate, o.PacketRate, o.DNSRate = 1e9, 1e9, 1e9, 1e9
}
