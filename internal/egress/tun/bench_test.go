package tun_test

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// BenchmarkTUNDownload measures a download on the real path: the kernel's
// TCP in a namespace reads, through a TUN device with virtio-net headers,
// from the egress stack, which relays from a server on the host's
// loopback. All of it runs in this process, so cpu-ms/MB is the CPU the
// whole path costs per MB (the stack, the server, and the reading side's
// kernel), the figure a change to the relay moves.
func BenchmarkTUNDownload(b *testing.B) {
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
	var r0, r1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	b.ResetTimer()
	for range b.N {
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := time.Duration(r1.Utime.Nano()-r0.Utime.Nano()+r1.Stime.Nano()-r0.Stime.Nano()) * time.Nanosecond
	b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/MB")
	b.ReportMetric(float64(r1.Nvcsw-r0.Nvcsw+r1.Nivcsw-r0.Nivcsw)/float64(b.N), "ctxsw/MB")
}
