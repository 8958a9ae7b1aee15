package insandbox

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/agent/boot"
)

// An agent told to listen on TCP without a peer refuses to start: it would
// serve every process of its sandbox.
func TestParseTCPNeedsPeer(t *testing.T) {
	if _, err := parseTCP("10.0.2.100:49983", ""); err == nil || !strings.Contains(err.Error(), boot.PeerEnv) {
		t.Errorf("parseTCP without a peer = %v, want an error naming %s", err, boot.PeerEnv)
	}
	if _, err := parseTCP("10.0.2.100:49983", "10.0.2.2:1"); err == nil {
		t.Error("parseTCP with a peer that has a port: no error")
	}
	got, err := parseTCP("10.0.2.100:49983", "10.0.2.2")
	if err != nil || got.peer != netip.MustParseAddr("10.0.2.2") || got.addr != "10.0.2.100:49983" {
		t.Errorf("parseTCP = %+v, %v", got, err)
	}
}

// The environment a backend gives (boot.Env) makes a listener that
// serves its peer alone.
func TestAgentListenerServesPeerAlone(t *testing.T) {
	env, err := boot.Env(boot.Config{}, &boot.TCP{
		Listen: netip.MustParseAddrPort("127.0.0.1:0"), Peer: netip.MustParseAddr("127.0.0.2")})
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vals[k] = v
	}
	tcp, err := parseTCP(vals[boot.ListenEnv], vals[boot.PeerEnv])
	if err != nil {
		t.Fatal(err)
	}
	ln, err := agentListener(&tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Addr, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c.RemoteAddr()
			c.Close()
		}
	}()
	dial := func(from string) error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		return err
	}
	_ = dial("127.0.0.1") // the kernel accepts it; the listener resets it unseen
	if err := dial("127.0.0.2"); err != nil {
		t.Fatalf("dial from the peer: %v", err)
	}
	if a := <-accepted; !strings.HasPrefix(a.String(), "127.0.0.2:") {
		t.Errorf("the listener handed over a connection from %s", a)
	}
	if _, err := boot.Env(boot.Config{}, &boot.TCP{Listen: netip.MustParseAddrPort("127.0.0.1:0")}); err == nil {
		t.Error("boot.Env with a TCP listener but no peer: no error")
	}
}
