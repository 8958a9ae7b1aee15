package integration

import (
	"bufio"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/egress/egresstest"
	"github.com/fencesandbox/fence/internal/testutil"
)

// The fake internet: a network namespace "wan" joined to the host by a veth
// pair, with servers that log everything that reaches them (the oracle of
// the egress tests: an attempt fails only if the client fails AND nothing
// reached these servers).
const (
	wanHostIP  = "203.0.113.1"  // the host's end of the veth
	wanIP      = "203.0.113.10" // allowed.test, rebind.test
	evilIP     = "203.0.113.11" // evil.test and the look-alikes
	wanHostIP6 = "2001:db8::1"
	wanIP6     = "2001:db8::10"
	// privIP is a private (RFC 1918) address routed from the host into the
	// wan namespace, so that a flow the policy should refuse because it is
	// private is seen by the oracle instead of leaving the machine.
	privIP = "10.213.77.10"
)

// fakeNetEnv tells the test binary re-executed in the wan namespace where
// to log (see TestFakeNetHelper).
const fakeNetEnv = "FENCE_FAKENET_LOG"

// fakeNet is a running fake internet.
type fakeNet struct {
	NS      string // network namespace name
	HostIf  string // host end of the veth
	LogPath string
	DNS     *egresstest.DNSServer // upstream resolver for the daemon (on 127.0.0.1)
	// CAFile is the root the wan's HTTPS servers (port 443) chain to: the
	// "public" root a daemon under test is given (fence serve
	// --upstream-ca), as does port 9443. Port 8443 serves a
	// self-signed certificate no daemon trusts.
	CAFile string
	TLSDir string
}

// fakeNetTLSEnv tells the helper where its certificates are.
const fakeNetTLSEnv = "FENCE_FAKENET_TLS"

// dnsZone is the upstream DNS zone of the egress tests.
func dnsZone() map[string][]string {
	return map[string][]string{
		"allowed.test":              {wanIP, wanIP6},
		"evil.test":                 {evilIP},
		"evilallowed.test":          {evilIP},
		"allowed.test.evil.test":    {evilIP},
		"secret.data.attacker.test": {evilIP},
		"meta.test":                 {"169.254.169.254"},
		"loop.test":                 {"127.0.0.1"},
		"priv.test":                 {privIP},
		"rebind.test":               {wanIP},
		"other.test":                {wanIP},
		// The egress gateway's tests: a bound API host, a host with a
		// header rule, and package registries, all on the wan.
		"api.secret.test":        {wanIP},
		"rules.test":             {wanIP},
		"pypi.org":               {wanIP},
		"files.pythonhosted.org": {wanIP},
		"registry.npmjs.org":     {wanIP},
		"deb.debian.org":         {wanIP},
		"proxy.golang.org":       {wanIP},
		"static.crates.io":       {wanIP},
		"github.com":             {wanIP},
	}
}

// newFakeNet builds the wan namespace and its veth, starts the logging
// servers in it and the upstream DNS server, and tears it all down when t
// ends. It must run before the daemon starts, so that the daemon counts
// the veth's addresses among the host's own.
func newFakeNet(t *testing.T) *fakeNet {
	t.Helper()
	testutil.RequireRoot(t)
	// The fake internet's addresses are fixed: copies of this test (other
	// checkouts on the same host) take turns instead of failing.
	lock, err := os.OpenFile("/run/fence-fakenet.lock", os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatalf("fake net lock: %v", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("fake net lock: %v", err)
	}
	t.Cleanup(func() { lock.Close() })
	// Every fake net is made and removed under the lock, so one found now
	// was left by a test binary that was killed (a timeout, a ^C); its
	// routes would hijack 203.0.113.0/24 for the whole host. Remove it.
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if name, _, _ := strings.Cut(strings.TrimSpace(line), " "); strings.HasPrefix(name, "fencewan-") {
				t.Logf("removing the fake net %s a killed test left", name)
				exec.Command("ip", "netns", "del", name).Run()
				exec.Command("ip", "link", "del", "fwh"+strings.TrimPrefix(name, "fencewan-")).Run()
			}
		}
	}
	if out, _ := exec.Command("ip", "route", "show", "203.0.113.0/24").CombinedOutput(); len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("203.0.113.0/24 is already routed on this host (another fake net?): %s", out)
	}
	sfx := randHex(3)
	f := &fakeNet{NS: "fencewan-" + sfx, HostIf: "fwh" + sfx, LogPath: t.TempDir() + "/wan.log"}
	peer := "fww" + sfx
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", f.NS)
	t.Cleanup(func() {
		// Deleting the namespace deletes the veth pair and its routes.
		exec.Command("ip", "netns", "del", f.NS).Run()
		exec.Command("ip", "link", "del", f.HostIf).Run()
	})
	ip("link", "add", f.HostIf, "type", "veth", "peer", "name", peer, "netns", f.NS)
	ip("addr", "add", wanHostIP+"/24", "dev", f.HostIf)
	ip("-6", "addr", "add", wanHostIP6+"/64", "dev", f.HostIf, "nodad")
	ip("link", "set", f.HostIf, "up")
	ip("route", "add", privIP+"/32", "dev", f.HostIf)
	ip("-n", f.NS, "link", "set", "lo", "up")
	for _, a := range []string{wanIP + "/24", evilIP + "/24", privIP + "/32"} {
		ip("-n", f.NS, "addr", "add", a, "dev", peer)
	}
	ip("-n", f.NS, "-6", "addr", "add", wanIP6+"/64", "dev", peer, "nodad")
	ip("-n", f.NS, "link", "set", peer, "up")
	ip("-n", f.NS, "route", "add", "default", "via", wanHostIP)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", f.NS, exe, "-test.run=^TestFakeNetHelper$", "-test.count=1")
	f.TLSDir = t.TempDir()
	if err := writeWanPKI(f.TLSDir); err != nil {
		t.Fatalf("making the wan's certificates: %v", err)
	}
	f.CAFile = filepath.Join(f.TLSDir, "ca.pem")
	cmd.Env = append(os.Environ(), fakeNetEnv+"="+f.LogPath, fakeNetTLSEnv+"="+f.TLSDir)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	stdin, err := cmd.StdinPipe() // the helper exits when this closes
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the wan servers: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			lines := f.since(0)
			if len(lines) > 100 {
				lines = append([]string{"…"}, lines[len(lines)-100:]...)
			}
			t.Logf("wan log (the end):\n%s", strings.Join(lines, "\n"))
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for !slicesContains(f.since(0), "ready") {
		select {
		case <-done:
			t.Fatalf("wan servers exited: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("wan servers not ready after 20s: %s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.selfCheck(t)
	f.DNS = egresstest.NewDNSServer(t, dnsZone())
	f.DNS.SetTTL("rebind.test", 0) // the daemon's DNS cache keeps nothing of it
	return f
}

// selfCheck proves the oracle sees what it must: a TCP SYN, a datagram and
// an echo request from the host to the wan addresses all get logged.
func (f *fakeNet) selfCheck(t *testing.T) {
	t.Helper()
	want := map[string]bool{}
	for _, a := range []string{wanIP, evilIP, privIP, wanIP6} {
		hp := net.JoinHostPort(a, "5353")
		c, err := net.Dial("udp", hp)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("self-check"))
		c.Close()
		want["udp-packet dst="+hp] = true
		hp = net.JoinHostPort(a, "8080")
		if c, err := net.DialTimeout("tcp", hp, 5*time.Second); err == nil {
			c.Close()
		}
		want["syn dst="+hp] = true
		network, typ := "ip4:icmp", byte(8)
		if strings.Contains(a, ":") {
			network, typ = "ip6:ipv6-icmp", 128
		}
		pc, err := net.ListenPacket(network, "")
		if err != nil {
			t.Fatal(err)
		}
		msg := []byte{typ, 0, 0, 0, 0, 1, 0, 1}
		if typ == 8 {
			msg[2], msg[3] = 0xf7, 0xfd // checksum of this message
		}
		if _, err := pc.WriteTo(msg, &net.IPAddr{IP: net.ParseIP(a)}); err != nil {
			t.Fatalf("echo request to %s: %v", a, err)
		}
		pc.Close()
		want["icmp-echo dst="+a] = true
	}
	eventually(t, 10*time.Second, "the wan sniffers logging the self-check", func() bool {
		log := strings.Join(f.since(0), "\n")
		for w := range want {
			if !strings.Contains(log, w+" ") {
				return false
			}
		}
		return true
	})
}

func slicesContains(lines []string, s string) bool {
	for _, l := range lines {
		if l == s {
			return true
		}
	}
	return false
}

// mark returns the position after the last line the wan servers logged,
// once the log has been quiet for a moment: packets of an earlier attempt
// (a retransmission, a sniffer line written late) must not count against
// the next one.
func (f *fakeNet) mark() int {
	n := len(f.since(0))
	for quiet := 0; quiet < 3; {
		time.Sleep(100 * time.Millisecond)
		if m := len(f.since(0)); m != n {
			n, quiet = m, 0
			continue
		}
		quiet++
	}
	return n
}

// since returns the lines the wan servers logged after position m.
func (f *fakeNet) since(m int) []string {
	b, _ := os.ReadFile(f.LogPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		lines = nil
	}
	if m > len(lines) {
		return nil
	}
	return lines[m:]
}

// dnsMark and dnsSince do the same for the upstream DNS server's queries.
func (f *fakeNet) dnsMark() int { return len(f.DNS.Queries()) }

func (f *fakeNet) dnsSince(m int) []string {
	q := f.DNS.Queries()
	if m > len(q) {
		return nil
	}
	return q[m:]
}

// --- the servers inside the wan namespace ---

// TestFakeNetHelper is not a test: newFakeNet runs the test binary with
// -test.run=^TestFakeNetHelper$ inside the wan namespace, and this serves
// there until its stdin closes, logging every connection, request,
// datagram, TCP SYN and ICMP echo request to $FENCE_FAKENET_LOG.
func TestFakeNetHelper(t *testing.T) {
	path := os.Getenv(fakeNetEnv)
	if path == "" {
		t.Skip("helper process of newFakeNet")
	}
	lf, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|os.O_SYNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	logf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(lf, format+"\n", args...)
	}
	fail := func(err error) {
		logf("error %v", err)
		t.Fatal(err)
	}

	// Raw sockets bound to each wan address see a copy of every packet to
	// that address: the tcpdump of the oracle. Only connection attempts
	// (SYN without ACK), datagrams and echo requests are logged.
	type sniffer struct{ network, addr string }
	var sniffers []sniffer
	for _, a := range []string{wanIP, evilIP, privIP} {
		sniffers = append(sniffers, sniffer{"ip4:tcp", a}, sniffer{"ip4:udp", a}, sniffer{"ip4:icmp", a})
	}
	sniffers = append(sniffers, sniffer{"ip6:tcp", wanIP6}, sniffer{"ip6:udp", wanIP6}, sniffer{"ip6:ipv6-icmp", wanIP6})
	for _, s := range sniffers {
		pc, err := net.ListenPacket(s.network, s.addr)
		if err != nil {
			fail(fmt.Errorf("raw socket %s %s: %w", s.network, s.addr, err))
		}
		go func() {
			buf := make([]byte, 65536)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				p := buf[:n]
				dst := net.JoinHostPort(s.addr, "")
				switch {
				case strings.HasSuffix(s.network, ":tcp") && n >= 14:
					if p[13]&0x02 != 0 && p[13]&0x10 == 0 {
						logf("syn dst=%s%d src=%s", dst, binary.BigEndian.Uint16(p[2:4]), from)
					}
				case strings.HasSuffix(s.network, ":udp") && n >= 8:
					logf("udp-packet dst=%s%d src=%s", dst, binary.BigEndian.Uint16(p[2:4]), from)
				case s.network == "ip4:icmp" && n >= 1 && p[0] == 8,
					s.network == "ip6:ipv6-icmp" && n >= 1 && p[0] == 128:
					logf("icmp-echo dst=%s src=%s", s.addr, from)
				}
			}
		}()
	}

	// UDP echo on 53 (a foreign resolver), 443 (QUIC) and 5353.
	for _, port := range []string{"53", "443", "5353"} {
		pc, err := net.ListenPacket("udp", ":"+port)
		if err != nil {
			fail(err)
		}
		go func() {
			buf := make([]byte, 65536)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				logf("udp port=%s src=%s n=%d", port, from, n)
				pc.WriteTo(buf[:n], from)
			}
		}()
	}

	// What /store kept, for /get (a blob store, on every port).
	var keptMu sync.Mutex
	var kept string

	// HTTP on 80 and 8080, HTTPS on 443 and 9443, with a self-signed certificate for
	// every name of the zone.
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/bench/small":
			// Measures: not logged (the log is synchronous).
			io.WriteString(w, "ok\n")
			return
		case "/bench/bytes":
			n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
			w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
			io.CopyN(w, zeroReader{}, n)
			return
		}
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		logf("http local=%s host=%s path=%s src=%s", local, r.Host, r.URL.Path, r.RemoteAddr)
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		// What a request carried, for the gateway's tests: every header,
		// the query and the body, on one line.
		logf("request host=%s proto=%s method=%s uri=%q headers=%q body=%q", r.Host, r.Proto, r.Method, r.RequestURI, r.Header, body)
		switch {
		case r.URL.Path == "/headers":
			// Echoes the request's headers back (httpbin's /headers).
			for k, v := range r.Header {
				fmt.Fprintf(w, "%s: %s\n", k, strings.Join(v, ","))
			}
			return
		case r.URL.Path == "/early-hints":
			// Echoes the Authorization header in a 103 Early Hints, then
			// answers plainly.
			w.Header().Set("X-Early-Authorization", r.Header.Get("Authorization"))
			w.WriteHeader(http.StatusEarlyHints)
			clear(w.Header())
			io.WriteString(w, "after early hints\n")
			return
		case r.URL.Path == "/headers-stacked":
			// /headers gzipped, under two Content-Encoding lines:
			// identity, then gzip.
			w.Header()["Content-Encoding"] = []string{"identity", "gzip"}
			zw := gzip.NewWriter(w)
			for k, v := range r.Header {
				fmt.Fprintf(zw, "%s: %s\n", k, strings.Join(v, ","))
			}
			zw.Close()
			return
		case strings.HasPrefix(r.URL.Path, "/fake/") && !isArtifact(r.URL.Path):
			// A flat Debian repository with one package, for apt: an
			// unsigned Release and an uncompressed Packages.
			switch cleanPath(r.URL.Path) {
			case "/fake/Release", "/fake/Packages":
			default:
				http.NotFound(w, r)
				return
			}
			// A flat Debian repository with one package, for apt.
			pkgs := fakeDebPackages()
			if cleanPath(r.URL.Path) == "/fake/Release" {
				sum := sha256.Sum256([]byte(pkgs))
				fmt.Fprintf(w, "Origin: fence-fake\nLabel: fence-fake\nSuite: fake\nCodename: fake\nDate: Sat, 01 Nov 2025 00:00:00 UTC\nArchitectures: all amd64 arm64\nSHA256:\n %x %d Packages\n", sum, len(pkgs))
				return
			}
			io.WriteString(w, pkgs)
			return
		case strings.HasPrefix(r.URL.Path, "/simple/requests"):
			// PyPI's simple index, as pip reads it.
			sum := sha256.Sum256(artifactBytes(pypiWheelPath))
			fmt.Fprintf(w, "<html><body><a href=\"https://files.pythonhosted.org%s#sha256=%x\">requests-2.32.3-py3-none-any.whl</a></body></html>\n", pypiWheelPath, sum)
			return
		case r.URL.Path == "/store":
			// Keeps the Authorization header, as blob stores, paste
			// services and file APIs keep what they get.
			keptMu.Lock()
			kept = r.Header.Get("Authorization")
			keptMu.Unlock()
			io.WriteString(w, "stored\n")
			return
		case r.URL.Path == "/get":
			// Serves what /store kept, with ranges (http.ServeContent),
			// and its digest when asked for one.
			keptMu.Lock()
			k := kept
			keptMu.Unlock()
			if r.Header.Get("Want-Repr-Digest") != "" || r.Header.Get("Want-Digest") != "" {
				sum := sha256.Sum256([]byte(k))
				w.Header().Set("Repr-Digest", "sha-256=:"+base64.StdEncoding.EncodeToString(sum[:])+":")
			}
			http.ServeContent(w, r, "", time.Time{}, strings.NewReader(k))
			return
		case r.URL.Path == "/names":
			// Makes header names of the query's q and of the
			// Authorization token.
			if q := r.URL.Query().Get("q"); q != "" {
				w.Header().Set("X-"+q, "1")
			}
			if a := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "); a != "" {
				w.Header().Set("X-Auth-"+a, "1")
			}
			io.WriteString(w, "names\n")
			return
		case r.URL.Path == "/redirect":
			http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
			return
		case isArtifact(r.URL.Path):
			w.Write(artifactBytes(cleanPath(r.URL.Path)))
			return
		}
		fmt.Fprintf(w, "hello from wan host=%s path=%s\n", r.Host, r.URL.Path)
	})
	cert, err := selfSigned()
	if err != nil {
		fail(err)
	}
	tlsDir := os.Getenv(fakeNetTLSEnv)
	signed, err := tls.LoadX509KeyPair(filepath.Join(tlsDir, "leaf.pem"), filepath.Join(tlsDir, "leaf-key.pem"))
	if err != nil {
		fail(err)
	}
	untrusted := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	tlsCfg := &tls.Config{
		Certificates: []tls.Certificate{signed},
		NextProtos:   []string{"h2", "http/1.1"},
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			logf("sni name=%q local=%s src=%s", h.ServerName, h.Conn.LocalAddr(), h.Conn.RemoteAddr())
			return nil, nil
		},
	}
	for _, port := range []string{"80", "8080", "443", "8443", "9443"} {
		l, err := net.Listen("tcp", ":"+port)
		if err != nil {
			fail(err)
		}
		var ln net.Listener = &loggingListener{Listener: l, logf: logf}
		switch port {
		case "443", "9443":
			ln = tls.NewListener(ln, tlsCfg)
		case "8443":
			ln = tls.NewListener(ln, untrusted)
		}
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 30 * time.Second, ErrorLog: nil}
		go srv.Serve(ln)
	}
	serveFakeSOCKS(logf, fail) // a SOCKS5 egress proxy on port 1080
	logf("ready")
	io.Copy(io.Discard, os.Stdin)
}

// loggingListener logs every accepted connection and its first bytes.
type loggingListener struct {
	net.Listener
	logf func(string, ...any)
}

func (l *loggingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.logf("accept local=%s src=%s", c.LocalAddr(), c.RemoteAddr())
	return &loggingConn{Conn: c, logf: l.logf}, nil
}

type loggingConn struct {
	net.Conn
	logf func(string, ...any)
	once sync.Once
}

func (c *loggingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.once.Do(func() { c.logf("data local=%s src=%s n=%d", c.LocalAddr(), c.RemoteAddr(), n) })
	}
	return n, err
}

// wanLeafTemplate is the template of the wan servers' certificate: every
// name and address of the zone.
func wanLeafTemplate(serial int64) *x509.Certificate {
	var names []string
	for n := range dnsZone() {
		names = append(names, n)
	}
	return &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "fence fake wan"},
		DNSNames:     names,
		IPAddresses:  []net.IP{net.ParseIP(wanIP), net.ParseIP(evilIP), net.ParseIP(wanIP6)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
}

// selfSigned makes a certificate for every name of dnsZone.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := wanLeafTemplate(1)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// --- host-side canary ---

// canary is a TCP listener on every host address (IPv4 and IPv6) that
// records who connects: no sandbox may ever reach it.
type canary struct {
	Port  int
	mu    sync.Mutex
	conns []string
}

func newCanary(t *testing.T) *canary {
	t.Helper()
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	c := &canary{Port: l.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			c.mu.Lock()
			c.conns = append(c.conns, fmt.Sprintf("%s -> %s", conn.RemoteAddr(), conn.LocalAddr()))
			c.mu.Unlock()
			go func() {
				conn.SetDeadline(time.Now().Add(2 * time.Second))
				first, _ := bufio.NewReader(conn).ReadString('\n')
				c.mu.Lock()
				c.conns = append(c.conns, fmt.Sprintf("  sent %q", first))
				c.mu.Unlock()
				conn.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhello from the host canary\n"))
				conn.Close()
			}()
		}
	}()
	return c
}

// Conns returns the connections received so far.
func (c *canary) Conns() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.conns...)
}

// writeWanPKI makes the wan's CA and a certificate for every name and
// address of the zone under it, as ca.pem, leaf.pem and leaf-key.pem.
func writeWanPKI(dir string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(10),
		Subject:               pkix.Name{CommonName: "fence fake public root"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := wanLeafTemplate(11)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	for name, b := range map[string]*pem.Block{
		"ca.pem":       {Type: "CERTIFICATE", Bytes: caDER},
		"leaf.pem":     {Type: "CERTIFICATE", Bytes: der},
		"leaf-key.pem": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(b), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// isArtifact reports whether the wan serves path as a package artifact.
func isArtifact(path string) bool {
	for _, ext := range []string{".whl", ".tar.gz", ".tgz", ".deb", ".zip", ".crate"} {
		if strings.HasSuffix(path, ext) {
			return true
		}
	}
	return false
}

// artifactBytes is the content the wan serves for an artifact path:
// 96 KiB that depend on the path.
func artifactBytes(path string) []byte {
	out := make([]byte, 0, 96<<10)
	sum := sha256.Sum256([]byte(path))
	for len(out) < cap(out) {
		out = append(out, sum[:]...)
		sum = sha256.Sum256(sum[:])
	}
	return out
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// The fake registries' artifacts.
const (
	pypiWheelPath = "/packages/aa/bb/cc/requests-2.32.3-py3-none-any.whl"
	debPath       = "/fake/pool/main/h/hello/hello_2.10-3_all.deb"
)

// fakeDebPackages is the Packages index of the fake Debian repository.
func fakeDebPackages() string {
	deb := artifactBytes(debPath)
	sum := sha256.Sum256(deb)
	return fmt.Sprintf("Package: hello\nVersion: 2.10-3\nArchitecture: all\nMaintainer: fence <fence@example.invalid>\n"+
		"Filename: %s\nSize: %d\nSHA256: %x\nDescription: fake package\n\n", strings.TrimPrefix(debPath, "/fake/"), len(deb), sum)
}

// cleanPath is path.Clean (the wan helper's own variables shadow the
// package's name).
func cleanPath(p string) string { return path.Clean(p) }
