package tun_test

import (
	"context"
	"io"
	"net"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/sysmon"
)

// BenchmarkTUNDownload measures a download on the real path: the kernel's
// TCP in a namespace reads, through a TUN device with virtio-net headers,
// from the egress stack, which relays from a server on the host's
// loopback. All of it runs in this process, so cpu-ms/MB is the CPU the
// whole path costs per MB (the stack, the server, and the reading side's
// kernel), the figure a change to the relay moves. The runtime's monitor
// thread is relaxed as the daemon's is (package sysmon), so that its
// wake-ups count as they do there. goroutines/MB counts the goroutines
// started per MB, each a hand-off on the download's path.
func BenchmarkTUNDownload(b *testing.B) {
	relaxSysmon(b)
	e := newPathEnv(b, true, func(c net.Conn) {
		buf := make([]byte, 256<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	var c net.Conn
	var err error
	inNetns(b, e.ns, func() { c, err = net.DialTimeout("tcp", "203.0.113.9:80", 5*time.Second) })
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	// Warm up: past the flow's first MiBs, its buffers have grown.
	for range 8 {
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
	dup0 := dupSegments(b, e.ns)
	var r0, r1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	g0 := goroutinesCreated()
	b.ResetTimer()
	for range b.N {
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	g1 := goroutinesCreated()
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := time.Duration(r1.Utime.Nano()-r0.Utime.Nano()+r1.Stime.Nano()-r0.Stime.Nano()) * time.Nanosecond
	b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/MB")
	b.ReportMetric(float64(r1.Nvcsw-r0.Nvcsw+r1.Nivcsw-r0.Nivcsw)/float64(b.N), "ctxsw/MB")
	b.ReportMetric(float64(dupSegments(b, e.ns)-dup0)*1024/float64(b.N), "dup-segs/GB")
	b.ReportMetric(float64(g1-g0)/float64(b.N), "goroutines/MB")
}

// relaxSysmon gives this process's sysmon thread the timer slack the
// daemon gives its own, for as long as b runs.
func relaxSysmon(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sysmon.Relax(ctx, "/proc", sysmon.Default, sysmon.KeepEvery); err != nil {
			b.Logf("sysmon left as it is: %v", err)
		}
	}()
	b.Cleanup(func() { cancel(); <-done })
}

// BenchmarkTUNUpload is BenchmarkTUNDownload the other way: the kernel's
// TCP in the namespace sends through the stack to a server on the host's
// loopback that reads. The stack's packets to the sandbox are then its
// acknowledgements and window updates.
func BenchmarkTUNUpload(b *testing.B) {
	got := make(chan int64, 1)
	e := newPathEnv(b, true, func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		got <- n
	})
	var c net.Conn
	var err error
	inNetns(b, e.ns, func() { c, err = net.DialTimeout("tcp", "203.0.113.9:80", 5*time.Second) })
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for range 8 {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
	var r0, r1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c.Close()
	if n := <-got; n != int64(b.N+8)<<20 {
		b.Fatalf("the server read %d bytes, want %d", n, int64(b.N+8)<<20)
	}
	b.StopTimer()
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := time.Duration(r1.Utime.Nano()-r0.Utime.Nano()+r1.Stime.Nano()-r0.Stime.Nano()) * time.Nanosecond
	b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/MB")
	b.ReportMetric(float64(r1.Nvcsw-r0.Nvcsw+r1.Nivcsw-r0.Nivcsw)/float64(b.N), "ctxsw/MB")
}

// dupSegments returns the segments the namespace's kernel received twice
// (TcpExt TCPDSACKOldSent: it reported each in a D-SACK): what the
// stack retransmitted although nothing was lost.
func dupSegments(t testing.TB, ns int) int64 {
	var b []byte
	var err error
	inNetns(t, ns, func() { b, err = os.ReadFile("/proc/thread-self/net/netstat") })
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		k, v := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		for j := 1; j < len(k) && j < len(v) && k[0] == "TcpExt:"; j++ {
			if k[j] == "TCPDSACKOldSent" {
				n, _ := strconv.ParseInt(v[j], 10, 64)
				return n
			}
		}
	}
	t.Fatal("no TcpExt:TCPDSACKOldSent")
	return 0
}

// BenchmarkTUNConnect measures a new connection on the real path as fence
// bench does (connect, 8 bytes up, 1 byte back, the server's close), and
// the same from the host straight to the server: the p50 of each and
// their difference, what the stack adds per connection.
func BenchmarkTUNConnect(b *testing.B) {
	e := newPathEnv(b, true, func(c net.Conn) {
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		c.Write(hdr[:1])
	})
	ask := func(dial func() (net.Conn, error)) time.Duration {
		t := time.Now()
		c, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		c.Write(make([]byte, 8))
		if _, err := io.Copy(io.Discard, c); err != nil {
			b.Fatal(err)
		}
		return time.Since(t)
	}
	var in, host []time.Duration
	var created uint64    // goroutines started during the sandbox's connections
	var cpu time.Duration // the process's CPU during the sandbox's batches
	// In batches, alternating; a batch in the namespace runs on one
	// thread in it.
	for done := 0; done < b.N; {
		k := min(10, b.N-done)
		c0 := processCPU()
		inNetns(b, e.ns, func() {
			for range k {
				g0 := goroutinesCreated()
				in = append(in, ask(func() (net.Conn, error) { return net.DialTimeout("tcp", "203.0.113.9:80", 5*time.Second) }))
				created += goroutinesCreated() - g0
				time.Sleep(5 * time.Millisecond) // within the stack's new-flow rate
			}
		})
		cpu += processCPU() - c0
		for range k {
			host = append(host, ask(func() (net.Conn, error) { return net.DialTimeout("tcp", e.ln.Addr().String(), 5*time.Second) }))
			time.Sleep(5 * time.Millisecond)
		}
		done += k
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1e3
	}
	pi, ph := p50(in), p50(host)
	b.ReportMetric(pi, "sandbox-ms")
	b.ReportMetric(ph, "host-ms")
	b.ReportMetric(pi-ph, "added-ms")
	// Each one a hand-off between goroutines on the connection's path
	// (the client's own, the server's and the stack's alike).
	b.ReportMetric(float64(created)/float64(len(in)), "goroutines/conn")
	// The stack's, the server's and the namespace's kernel's work for
	// each connection (with what the stack's timers do meanwhile for the
	// connections before it).
	b.ReportMetric(float64(cpu.Microseconds())/float64(len(in)), "cpu-us/conn")
}

// processCPU is the CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// goroutinesCreated is the number of goroutines this process has started.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
