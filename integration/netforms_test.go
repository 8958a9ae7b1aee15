package integration

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// The fake internet's SOCKS5 proxy (in the wan namespace): it requires
// these credentials and logs every handshake.
const (
	socksPort = "1080"
	socksUser = "fence"
	socksPass = "socks-pw-not-for-logs"
)

// serveFakeSOCKS runs a SOCKS5 server (RFC 1928 CONNECT, RFC 1929
// username/password) on :1080 inside the wan namespace. Names are resolved
// in the fake zone. It logs "socks src=… auth ok|failed" and "socks
// src=… connect name|ip host:port".
func serveFakeSOCKS(logf func(string, ...any), fail func(error)) {
	l, err := net.Listen("tcp", ":"+socksPort)
	if err != nil {
		fail(err)
	}
	serve := func(c net.Conn) {
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		src := c.RemoteAddr().String()
		var h [2]byte
		if _, err := io.ReadFull(c, h[:]); err != nil || h[0] != 5 {
			logf("socks src=%s bad greeting", src)
			return
		}
		methods := make([]byte, h[1])
		io.ReadFull(c, methods)
		ok := false
		for _, m := range methods {
			ok = ok || m == 2
		}
		if !ok {
			logf("socks src=%s auth missing", src)
			c.Write([]byte{5, 0xff})
			return
		}
		c.Write([]byte{5, 2})
		var v [2]byte
		io.ReadFull(c, v[:])
		user := make([]byte, v[1])
		io.ReadFull(c, user)
		var pl [1]byte
		io.ReadFull(c, pl[:])
		pass := make([]byte, pl[0])
		io.ReadFull(c, pass)
		if string(user) != socksUser || string(pass) != socksPass {
			logf("socks src=%s auth failed user=%q", src, user)
			c.Write([]byte{1, 1})
			return
		}
		logf("socks src=%s auth ok user=%q", src, user)
		c.Write([]byte{1, 0})
		var req [4]byte
		if _, err := io.ReadFull(c, req[:]); err != nil || req[1] != 1 {
			return
		}
		var host, kind string
		switch req[3] {
		case 1, 4:
			b := make([]byte, map[byte]int{1: 4, 4: 16}[req[3]])
			io.ReadFull(c, b)
			a, _ := netip.AddrFromSlice(b)
			host, kind = a.String(), "ip"
		case 3:
			var n [1]byte
			io.ReadFull(c, n[:])
			b := make([]byte, n[0])
			io.ReadFull(c, b)
			host, kind = string(b), "name"
		default:
			return
		}
		var pb [2]byte
		io.ReadFull(c, pb[:])
		port := strconv.Itoa(int(binary.BigEndian.Uint16(pb[:])))
		logf("socks src=%s connect %s %s", src, kind, net.JoinHostPort(host, port))
		dst := host
		if kind == "name" {
			dst = ""
			for _, a := range dnsZone()[host] {
				if !strings.Contains(a, ":") {
					dst = a
					break
				}
			}
		}
		up, err := net.DialTimeout("tcp", net.JoinHostPort(dst, port), 5*time.Second)
		if err != nil {
			c.Write([]byte{5, 4, 0, 1, 0, 0, 0, 0, 0, 0})
			return
		}
		defer up.Close()
		c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0})
		c.SetDeadline(time.Time{})
		go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite() }()
		io.Copy(c, up)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
}

// TestNetworkForms checks E2B's network forms end to end against the fake
// internet: allowOut as exceptions to denyOut, allow_internet_access false
// with exceptions, the daemon's default for a create that says nothing,
// and the SOCKS5 egress proxy (the only way out when set; failing closed).
func TestNetworkForms(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t)
	x := &netEnv{fn: fn, canary: newCanary(t)}
	x.d = startDaemon(t, newDataDir(t), "--dns-upstream", fn.DNS.Addr)
	d := x.d
	proxy := &api.EgressProxy{Address: wanIP + ":" + socksPort, Username: socksUser, Password: socksPass}
	lists := func() *api.NetworkConfig {
		return &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"allowed.test", evilIP}}
	}
	proxied := lists()
	proxied.EgressProxy = proxy
	boxes := createAll(t, d, map[string]api.NewSandbox{
		"proxied":   {TemplateID: "base", Network: proxied},
		"denyone":   {TemplateID: "base", Network: &api.NetworkConfig{DenyOut: []string{evilIP}}},
		"allowonly": {TemplateID: "base", Network: &api.NetworkConfig{AllowOut: []string{wanIP}}},
		"offplus":   {TemplateID: "base", AllowInternetAccess: ptr(false), Network: &api.NetworkConfig{AllowOut: []string{wanIP}}},
		"default":   {TemplateID: "base"},
	})

	t.Run("deny one address alone: the rest stays open", func(t *testing.T) {
		e := boxes["denyone"].Envd()
		x.reached(t, e, curl+"http://allowed.test/d1", "path=/d1")
		x.refused(t, e, curl+"http://"+evilIP+"/d2", noPackets)
	})
	t.Run("allowOut alone is not an allowlist", func(t *testing.T) {
		e := boxes["allowonly"].Envd()
		x.reached(t, e, curl+"http://"+evilIP+"/a1", "path=/a1")
	})
	t.Run("allow_internet_access false with an allowOut exception", func(t *testing.T) {
		e := boxes["offplus"].Envd()
		x.reached(t, e, curl+"http://"+wanIP+"/o1", "path=/o1")
		x.refused(t, e, curl+"http://"+evilIP+"/o2", noPackets)
	})
	t.Run("a create that says nothing takes the daemon's default", func(t *testing.T) {
		x.refused(t, boxes["default"].Envd(), curl+"http://"+wanIP+"/n1", noPackets)
	})

	sb := boxes["proxied"]
	e := sb.Envd()
	hostSrc := "src=" + wanHostIP + ":" // what a direct connection from the daemon looks like
	fromHost := regexp.MustCompile(`src=` + regexp.QuoteMeta(wanHostIP) + `(:|\s|$)`)
	toProxy := regexp.MustCompile(`:108[01]\s`)
	// direct reports wan log lines since m that show the daemon reaching
	// a wan server other than the proxy (a SYN, an accepted connection).
	direct := func(m int) []string {
		var bad []string
		for _, l := range fn.since(m) {
			if fromHost.MatchString(l) && !toProxy.MatchString(l) && !strings.HasPrefix(l, "socks ") {
				bad = append(bad, l)
			}
		}
		return bad
	}
	put := func(t *testing.T, n *api.NetworkConfig) {
		t.Helper()
		body := fmt.Sprintf(`{"denyOut":["0.0.0.0/0"],"allowOut":["allowed.test",%q]`, evilIP)
		if n != nil && n.EgressProxy != nil {
			body += fmt.Sprintf(`,"egressProxy":{"address":%q,"username":%q,"password":%q}`, n.EgressProxy.Address, n.EgressProxy.Username, n.EgressProxy.Password)
		}
		body += "}"
		r := d.do(t, "PUT", "/sandboxes/"+sb.ID()+"/network", d.Key, strings.NewReader(body), nil)
		if r.Status != http.StatusNoContent {
			t.Fatalf("PUT network = %d %s", r.Status, r.Body)
		}
	}
	t.Run("egress proxy: names go by name, addresses by address, nothing directly", func(t *testing.T) {
		m := fn.mark()
		x.reached(t, e, curl+"http://allowed.test/p1", "path=/p1")
		x.reached(t, e, curl+"-k https://allowed.test/p2", `sni name="allowed.test"`)
		x.reached(t, e, curl+"http://"+evilIP+"/p3", "path=/p3")
		log := strings.Join(fn.since(m), "\n")
		for _, want := range []string{"connect name allowed.test:80", "connect name allowed.test:443", "connect ip " + evilIP + ":80", `auth ok user="fence"`} {
			if !strings.Contains(log, want) {
				t.Errorf("proxy log lacks %q:\n%s", want, log)
			}
		}
		if bad := direct(m); len(bad) > 0 {
			t.Errorf("the daemon connected directly despite the proxy:\n%s", strings.Join(bad, "\n"))
		}
		// The policy applies before the proxy: a refused name never
		// reaches it.
		x.refused(t, e, curl+"http://other.test/p4", noPackets)
	})
	t.Run("getInfo shows the proxy without its password", func(t *testing.T) {
		r := d.do(t, "GET", "/sandboxes/"+sb.ID(), d.Key, nil, nil)
		if !strings.Contains(string(r.Body), `"egressProxy":{"address":"`+wanIP+`:1080","username":"fence"}`) || strings.Contains(string(r.Body), socksPass) {
			t.Errorf("getInfo = %s", r.Body)
		}
		if strings.Contains(d.out.String(), socksPass) {
			t.Errorf("the daemon's log shows the proxy password")
		}
	})
	failsClosed := func(t *testing.T, path string) {
		t.Helper()
		m := fn.mark()
		out, code := attempt(t, e, curl+"http://allowed.test/"+path)
		if code == 0 || strings.Contains(out, "hello from") {
			t.Errorf("curl through a broken proxy: exit %d %q, want a failure", code, out)
		}
		time.Sleep(200 * time.Millisecond)
		for _, l := range fn.since(m) {
			if strings.Contains(l, "path=/"+path) || strings.Contains(l, "connect ") {
				t.Errorf("the flow got out: %s", l)
			}
		}
		if bad := direct(m); len(bad) > 0 {
			t.Errorf("the daemon connected directly:\n%s", strings.Join(bad, "\n"))
		}
	}
	t.Run("wrong password fails closed", func(t *testing.T) {
		put(t, &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: proxy.Address, Username: socksUser, Password: "wrong"}})
		failsClosed(t, "w1")
	})
	t.Run("proxy down fails closed", func(t *testing.T) {
		put(t, &api.NetworkConfig{EgressProxy: &api.EgressProxy{Address: evilIP + ":1081", Username: socksUser, Password: socksPass}})
		failsClosed(t, "w2")
	})
	t.Run("without the proxy the daemon connects itself", func(t *testing.T) {
		put(t, nil)
		x.reached(t, e, curl+"http://allowed.test/w3", "path=/w3 "+hostSrc)
	})
	t.Run("proxy at an internal address is refused", func(t *testing.T) {
		for _, addr := range []string{privIP + ":1080", "127.0.0.1:1080", wanHostIP + ":1080", "169.254.169.254:1080"} {
			body := fmt.Sprintf(`{"egressProxy":{"address":%q}}`, addr)
			r := d.do(t, "PUT", "/sandboxes/"+sb.ID()+"/network", d.Key, strings.NewReader(body), nil)
			if r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), "Invalid egress proxy config") {
				t.Errorf("PUT %s = %d %s, want 400 Invalid egress proxy config", body, r.Status, r.Body)
			}
		}
	})
}
