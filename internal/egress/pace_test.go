package egress_test

import (
	"context"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/egress"
)

// paceEnv is a stack whose packet rate is tiny (20 packets a second,
// burst 2), with its own counters.
func paceEnv(t *testing.T) (*env, *egress.Shared) {
	sh := egress.NewShared(egress.SharedOptions{})
	e := newEnv(t, cidrSpec, func(o *egress.Options) {
		o.Shared = sh
		o.PacketRate = 20
	})
	return e, sh
}

// download reads n bytes from the endless upstream on port 19.
func download(t *testing.T, e *env, n int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := e.sb.DialTCP(ctx, ap("203.0.113.1:19"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.CopyN(io.Discard, c, n); err != nil {
		t.Fatal(err)
	}
}

// TestPacketRateDoesNotCapDownload: the acknowledgements of a download are
// paid for by the data segments the stack sends, so a download is not
// bounded by the sandbox's packet rate. Here the rate is 20 packets a
// second and the sandbox acknowledges 16 MiB (256 segments of 64 KiB):
// paced, that took over 10 s and hundreds of paced packets.
func TestPacketRateDoesNotCapDownload(t *testing.T) {
	e, sh := paceEnv(t)
	start := time.Now()
	download(t, e, 16<<20)
	paced := sh.Stats().PacketsPaced
	t.Logf("16 MiB in %v, %d packets paced", time.Since(start).Round(time.Millisecond), paced)
	// The handshake and the few acknowledgements not tied to a segment
	// (window updates) may be paced; the download's are not.
	if paced > 8 {
		t.Errorf("%d packets paced during a download, want at most 8", paced)
	}
}

// TestPacketRateBoundsFloodAfterDownload: the credit a download earns is
// bounded; a flood of packets that earn nothing is paced past it.
func TestPacketRateBoundsFloodAfterDownload(t *testing.T) {
	e, sh := paceEnv(t)
	download(t, e, 16<<20)
	before := sh.Stats().PacketsPaced
	c, err := e.sb.DialUDP(netip.MustParseAddrPort("203.0.113.1:9999"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		// Until the test closes c.
		for range egress.MaxPaceCredit + 100 {
			if _, err := c.Write([]byte("x")); err != nil {
				return
			}
		}
	}()
	// The stack reads them at the packet rate once the banked credit
	// (at most MaxPaceCredit packets) is spent.
	eventually(t, "flood paced", func() bool { return sh.Stats().PacketsPaced-before >= 20 })
}
