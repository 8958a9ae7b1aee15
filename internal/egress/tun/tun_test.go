package tun_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/egresstest"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/egress/tun"
)

// newNetns creates an empty network namespace and returns an fd for it.
func newNetns(t testing.TB) int {
	t.Helper()
	type res struct {
		fd  int
		err error
	}
	ch := make(chan res)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- res{-1, err}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		ch <- res{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("creating netns: %v", r.err)
	}
	t.Cleanup(func() { unix.Close(r.fd) })
	return r.fd
}

// inNetns runs f on a thread inside the namespace; sockets f creates stay
// in it.
func inNetns(t testing.TB, ns int, f func()) {
	t.Helper()
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		f()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatalf("entering netns: %v", err)
	}
}

// lookup resolves name through the sandbox's resolver, from inside ns.
func lookup(t *testing.T, ns int, name string) []string {
	t.Helper()
	var conn net.Conn
	var err error
	inNetns(t, ns, func() {
		d := net.Dialer{Timeout: 5 * time.Second}
		conn, err = d.Dial("udp", netip.AddrPortFrom(egress.ResolverIPv4, 53).String())
	})
	if err != nil {
		t.Fatalf("dialing resolver: %v", err)
	}
	defer conn.Close()
	q := new(mdns.Msg)
	q.SetQuestion(mdns.Fqdn(name), mdns.TypeA)
	c := &mdns.Conn{Conn: conn}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.WriteMsg(q); err != nil {
		t.Fatalf("sending query: %v", err)
	}
	m, err := c.ReadMsg()
	if err != nil {
		t.Fatalf("reading answer: %v", err)
	}
	var out []string
	for _, rr := range m.Answer {
		if a, ok := rr.(*mdns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out
}

// TestTUNEndToEnd proves that a kernel network namespace whose only
// interface is a TUN device served by egress.Stack reaches what the policy
// allows (resolved through the stack's resolver, fetched with curl) and
// nothing else. It needs root for the namespace and /dev/net/tun.
func TestTUNEndToEnd(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: creates a network namespace and a TUN device")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl not installed")
	}
	dnsSrv := egresstest.NewDNSServer(t, map[string][]string{
		"allowed.test": {"203.0.113.10"},
		"evil.test":    {"203.0.113.66"},
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan string, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				got <- req.Host
				body := "hello " + req.Host
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
			}()
		}
	}()

	ns := newNetns(t)
	nsPath := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), ns)
	fd, err := tun.Create(nsPath, tun.Config{Addr: []netip.Prefix{egress.SandboxIPv4, egress.SandboxIPv6}})
	if err != nil {
		t.Fatalf("tun.Create: %v", err)
	}
	p, err := policy.Compile(policy.Spec{Allow: []policy.Rule{{Name: "allowed.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	rec := &egresstest.Recorder{}
	st, err := egress.New(context.Background(), egress.Options{
		SandboxID: "tuntest", FD: fd, Policy: p, DNSUpstream: dnsSrv.Addr, Recorder: rec,
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			if address != "203.0.113.10:80" {
				return nil, errors.New("unexpected dial to " + address)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, l.Addr().String())
		},
	})
	if err != nil {
		t.Fatalf("egress.New: %v", err)
	}
	defer st.Close()

	if as := lookup(t, ns, "allowed.test"); len(as) != 1 || as[0] != "203.0.113.10" {
		t.Fatalf("lookup(allowed.test) in netns = %v, want [203.0.113.10]", as)
	}
	if as := lookup(t, ns, "evil.test"); len(as) != 0 {
		t.Errorf("lookup(evil.test) in netns = %v, want none", as)
	}
	curl := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		args = append([]string{"--net=" + nsPath, "curl", "-sS", "--max-time", "3", "--noproxy", "*"}, args...)
		out, err := exec.CommandContext(ctx, "nsenter", args...).CombinedOutput()
		return string(out), err
	}
	if out, err := curl("--resolve", "allowed.test:80:203.0.113.10", "http://allowed.test/"); err != nil || out != "hello allowed.test" {
		t.Errorf("curl http://allowed.test/ = %q, %v, want hello allowed.test", out, err)
	}
	for _, args := range [][]string{
		{"--resolve", "evil.test:80:203.0.113.10", "http://evil.test/"}, // Host mismatch
		{"http://203.0.113.66/"},    // never resolved
		{"http://169.254.169.254/"}, // metadata
		{"http://[fd00:ec2::254]/"}, // metadata v6
	} {
		if out, err := curl(args...); err == nil {
			t.Errorf("curl %v = %q, want failure", args, out)
		}
	}
	// The refusals came from the policy, not from a broken route.
	denied := map[string]string{}
	for _, ev := range rec.Events() {
		if ev.Proto == "tcp" && !ev.Allowed {
			denied[ev.Dst.String()] = ev.Reason
		}
	}
	for dst, reason := range map[string]string{
		"203.0.113.66:80":    policy.ReasonDefaultDeny,
		"169.254.169.254:80": policy.ReasonNeverReachable,
		"[fd00:ec2::254]:80": policy.ReasonNeverReachable,
	} {
		if denied[dst] != reason {
			t.Errorf("denial of %s = %q, want %s (denied: %v)", dst, denied[dst], reason, denied)
		}
	}
	close(got)
	var hosts []string
	for h := range got {
		hosts = append(hosts, h)
	}
	if strings.Join(hosts, ",") != "allowed.test" {
		t.Errorf("upstream saw requests for %v, want only allowed.test", hosts)
	}

	// Closing the stack closes the fd, which removes the device.
	st.Close()
	inNetns(t, ns, func() {
		if _, err := net.InterfaceByName("eth0"); err == nil {
			t.Errorf("eth0 still exists after Close")
		}
	})
}
