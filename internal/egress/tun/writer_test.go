package tun_test

import (
	"bytes"
	"io"
	"net"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

// TestTUNDownloadKeepsOneWriter: a download on the real path (the
// namespace's kernel reading through the device from the stack) keeps the
// stack's one writer to the device past its first MiB, instead of
// starting one per burst of segments (1.2 to 1.5 per MiB before, 41 in
// 32 MiB): the whole process starts at most one goroutine per 2 MiB
// (gVisor's timers start one each time one fires, which a loaded machine
// makes more frequent: up to 16 in 64 MiB under the race detector at load
// average 50; the collector is held off meanwhile, its workers being
// goroutines too). Once the flow has
// ended, no writer is left.
func TestTUNDownloadKeepsOneWriter(t *testing.T) {
	e := newPathEnv(t, true, func(c net.Conn) {
		buf := make([]byte, 256<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	var c net.Conn
	var err error
	inNetns(t, e.ns, func() { c, err = net.DialTimeout("tcp", "203.0.113.9:80", 5*time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(60 * time.Second))
	buf := make([]byte, 1<<20)
	for range 4 { // past the flow's first MiB: a bulk flow
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	const mib = 64
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	g0 := goroutinesCreated()
	for range mib {
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	started := goroutinesCreated() - g0
	t.Logf("%d goroutines started over %d MiB", started, mib)
	if started > mib/2 {
		t.Errorf("%d goroutines started over a %d MiB download, want at most %d (the writer kept)", started, mib, mib/2)
	}
	c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for writerRunning() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if writerRunning() {
		t.Error("the stack's writer to the device still there 10 s after the flow ended")
	}
}

// writerRunning reports whether a goroutine of the stack's send queue
// (writing, or waiting for packets) exists.
func writerRunning() bool {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	return bytes.Contains(buf[:n], []byte("egress.(*sendQueue).write("))
}
