package integration

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// TestNeverReachableRanges attacks the ranges no sandbox may reach even
// when its own policy lists them, from inside a real sandbox on the fake
// internet: the operator's --deny-cidr ranges, and an address the host
// gains after the daemon started (a new interface, DHCP, a VPN), which the
// daemon must learn from the kernel rather than from its start-up list.
func TestNeverReachableRanges(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t)
	x := &netEnv{fn: fn, canary: newCanary(t)}
	x.d = startDaemon(t, newDataDir(t), "--dns-upstream", fn.DNS.Addr,
		"--deny-cidr", evilIP+"/32", "--deny-cidr", "2001:db8::11")
	boxes := createAll(t, x.d, map[string]api.NewSandbox{
		"cidr": {TemplateID: "base", Network: &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"},
			AllowOut: []string{"203.0.113.0/24", "2001:db8::/32", "evil.test"}}},
		"wide": {TemplateID: "base", Network: &api.NetworkConfig{
			AllowOut: []string{"0.0.0.0/0", "::/0", "168.63.129.16"}}},
	})
	sb := boxes["cidr"].Envd()
	ip := func(t *testing.T, args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}

	t.Run("azure wireserver", func(t *testing.T) {
		// Azure's WireServer is a public address that the platform
		// answers on every VM; the daemon dials as host root, which the
		// VM agent's firewall rule lets through. Here it is routed into
		// the fake internet, whose servers are the oracle.
		const wire = "168.63.129.16"
		peer := "fww" + strings.TrimPrefix(fn.HostIf, "fwh")
		ip(t, "-n", fn.NS, "addr", "add", wire+"/32", "dev", peer)
		ip(t, "route", "add", wire+"/32", "dev", fn.HostIf)
		t.Cleanup(func() { exec.Command("ip", "route", "del", wire+"/32", "dev", fn.HostIf).Run() })
		x.refused(t, boxes["wide"].Envd(), curl+"http://"+wire+"/machine?comp=goalstate", noPackets)
		x.refused(t, boxes["wide"].Envd(), curl+"http://"+wire+":32526/vmSettings", noPackets)
		// Control: the same sandbox reaches the fake internet otherwise.
		x.reached(t, boxes["wide"].Envd(), curl+"http://"+wanIP+"/wide", "path=/wide")
	})

	t.Run("deny-cidr", func(t *testing.T) {
		// Control: the same rule opens the rest of the range.
		x.reached(t, sb, curl+"http://"+wanIP+"/ctl", "path=/ctl")
		x.refused(t, sb, curl+"http://"+evilIP+"/op", noPackets)
		x.refused(t, sb, curl+"-g http://[::ffff:"+evilIP+"]/op", noPackets)
		// By a name the sandbox may resolve: the answer is refused too.
		x.refused(t, sb, curl+"http://evil.test/op", noPackets)
	})

	t.Run("host address added later", func(t *testing.T) {
		const new4, new6 = "203.0.113.77", "2001:db8::77"
		ip(t, "addr", "add", new4+"/32", "dev", fn.HostIf)
		ip(t, "-6", "addr", "add", new6+"/128", "dev", fn.HostIf, "nodad")
		t.Cleanup(func() {
			exec.Command("ip", "addr", "del", new4+"/32", "dev", fn.HostIf).Run()
			exec.Command("ip", "-6", "addr", "del", new6+"/128", "dev", fn.HostIf).Run()
		})
		// The kernel announces the change at once; give the daemon a
		// moment to take it in (no timing is asserted).
		time.Sleep(time.Second)
		port := strconv.Itoa(x.canary.Port)
		// The sandbox's rule covers both addresses; they are the host's
		// now, and the canary listens on them.
		x.refused(t, sb, curl+"http://"+new4+":"+port+"/late", noPackets)
		x.refused(t, sb, curl+"-g http://["+new6+"]:"+port+"/late", noPackets)
	})
}
