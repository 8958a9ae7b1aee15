package isolationtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/warm"
	"github.com/fencesandbox/fence/internal/netfence"
)

// RunNetwork runs the network cases: a backend attaches every network
// namespace it makes for a sandbox to the Network of its Spec (at create,
// and at each resume of a Pauser), the sandbox's traffic goes through the
// stack that Network's owner made (an allowed destination answers, a denied
// one does not, and the owner's policy change on its stack changes that),
// and each attached namespace's Link is closed exactly once: at kill, and
// when a create fails after its Attach. The Network is the suite's, over a
// real netfence.Fence: it needs root and a host IPv4 address other than
// loopback.
func RunNetwork(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	tests := []struct {
		name string
		fn   func(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string)
	}{
		{"TrafficGoesThroughTheOwnersFence", testOwnersFence},
		{"FailedCreateClosesItsLink", testFailedCreateLink},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newBackend, rootfs) })
	}
}

// recNet is a Network over a real netfence.Net that counts what the
// backend does with it.
type recNet struct {
	*netfence.Net
	// afterAttach, if set, runs after each successful Attach.
	afterAttach func()

	mu       sync.Mutex
	ids      []string // the sandboxes attached, in order
	attaches int
	closes   int
	doubles  int // Closes of a link closed already
	open     int
}

func (r *recNet) Attach(ctx context.Context, id, nsPath string, kernelPeer bool) (isolation.Link, error) {
	l, err := r.Net.Attach(ctx, id, nsPath, kernelPeer)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.ids = append(r.ids, id)
	r.attaches++
	r.open++
	r.mu.Unlock()
	if r.afterAttach != nil {
		r.afterAttach()
	}
	return &recLink{Link: l, r: r}, nil
}

func (r *recNet) counts() (attaches, open, closes, doubles int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attaches, r.open, r.closes, r.doubles
}

// waitClosed waits until every attached link is closed, and fails on a
// link closed twice.
func (r *recNet) waitClosed(t *testing.T, what string) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		a, open, c, d := r.counts()
		if d > 0 {
			t.Errorf("%s: %d links closed more than once", what, d)
		}
		if open == 0 {
			if c != a {
				t.Errorf("%s: %d attaches, %d closes", what, a, c)
			}
			if now, _ := r.Net.Attached(); now != 0 {
				t.Errorf("%s: the fence still has %d namespaces attached", what, now)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d links still open after %v", what, open, a, waitLimit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type recLink struct {
	isolation.Link
	r      *recNet
	mu     sync.Mutex
	closed bool
}

func (l *recLink) Close() error {
	l.mu.Lock()
	again := l.closed
	l.closed = true
	l.mu.Unlock()
	l.r.mu.Lock()
	if again {
		l.r.doubles++
	} else {
		l.r.closes++
		l.r.open--
	}
	l.r.mu.Unlock()
	if again {
		return errors.New("link closed twice")
	}
	return l.Link.Close()
}

// hostTarget serves HTTP on a host IPv4 address other than loopback and
// returns a fence that lets sandboxes reach that address (and no other of
// the host's), the policy allowing it, and its address.
func hostTarget(t *testing.T) (*netfence.Fence, *policy.Policy, string) {
	t.Helper()
	hosts := netfence.HostAddrs()
	var addr netip.Addr
	for _, a := range hosts {
		if a.Is4() && !a.IsLoopback() && !a.IsLinkLocalUnicast() {
			addr = a
			break
		}
	}
	if !addr.IsValid() {
		t.Fatalf("no host IPv4 address other than loopback in %v", hosts)
	}
	ln, err := net.Listen("tcp4", net.JoinHostPort(addr.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "fence-reached")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	f := netfence.Fence{HostAddrs: slices.DeleteFunc(slices.Clone(hosts), func(a netip.Addr) bool { return a == addr })}.WithDefaults()
	pol, err := policy.Compile(policy.Spec{Allow: []policy.Rule{{Prefix: netip.PrefixFrom(addr, 32)}}})
	if err != nil {
		t.Fatal(err)
	}
	return &f, pol, ln.Addr().String()
}

// reaches reports whether the sandbox gets the host target's answer (an
// HTTP request through busybox nc).
func reaches(t *testing.T, s isolation.Sandbox, target string) bool {
	t.Helper()
	host, port, _ := net.SplitHostPort(target)
	out, code, err := Exec(t.Context(), s, "/bin/sh", "-c",
		`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 `+host+" "+port+" 2>&1")
	if err != nil {
		t.Fatalf("exec nc: %v", err)
	}
	ok := strings.Contains(out, "fence-reached")
	if !ok {
		t.Logf("nc %s: exit %d: %q", target, code, out)
	}
	return ok
}

func testOwnersFence(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	b := newBackend(t)
	f, allow, url := hostTarget(t)
	nw := &recNet{Net: f.New(allow)}
	s, err := b.Create(t.Context(), isolation.Spec{ID: NewID(), RootFS: rootfs, Network: nw})
	if err != nil {
		t.Fatalf("Create() = %v", err)
	}
	t.Cleanup(func() { s.Kill(context.WithoutCancel(t.Context())) })
	if a, open, _, _ := nw.counts(); a != 1 || open != 1 {
		t.Fatalf("after Create: %d attaches, %d open; want the Spec's Network attached once", a, open)
	}
	if !reaches(t, s, url) {
		t.Errorf("the sandbox does not reach %s, which its owner's fence allows", url)
	}
	nw.SetPolicy(nil) // the owner changes its stack's policy: deny all
	if reaches(t, s, url) {
		t.Errorf("the sandbox reaches %s after its owner's fence denied everything", url)
	}
	nw.SetPolicy(allow)
	if !reaches(t, s, url) {
		t.Errorf("the sandbox does not reach %s after its owner's fence allowed it again", url)
	}
	if p, ok := isolation.As[isolation.Pauser](s); ok {
		if err := p.Pause(t.Context()); err != nil {
			t.Fatalf("Pause() = %v", err)
		}
		nw.SetPolicy(nil) // while paused: the resume must follow it
		if err := p.Resume(t.Context()); err != nil {
			t.Fatalf("Resume() = %v", err)
		}
		a, open, _, _ := nw.counts()
		if open != 1 {
			t.Fatalf("after Pause and Resume: %d attaches, %d open; want one namespace attached", a, open)
		}
		t.Logf("attaches after a pause and resume: %d", a)
		if reaches(t, s, url) {
			t.Errorf("the resumed sandbox reaches %s, which its owner's fence denied while it was paused", url)
		}
		nw.SetPolicy(allow)
		if !reaches(t, s, url) {
			t.Errorf("the resumed sandbox does not reach %s, which its owner's fence allows", url)
		}
	}
	if err := s.Kill(t.Context()); err != nil {
		t.Fatalf("Kill() = %v", err)
	}
	waitDone(t, s, "after Kill")
	nw.waitClosed(t, "after Kill")
}

func testFailedCreateLink(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	b := newBackend(t)
	f, _, _ := hostTarget(t)
	for i := range 3 {
		// The create's context ends right after the Attach: the create
		// fails (or, had it finished first, succeeds and is killed), and
		// either way its link is closed, once.
		ctx, cancel := context.WithCancel(t.Context())
		nw := &recNet{Net: f.New(nil), afterAttach: cancel}
		id := NewID()
		s, err := b.Create(ctx, isolation.Spec{ID: id, RootFS: rootfs, Network: nw})
		cancel()
		if a, _, _, _ := nw.counts(); a != 1 {
			t.Errorf("create %d: %d attaches, want 1", i, a)
		}
		if err == nil {
			t.Logf("create %d finished before its context ended; killing it", i)
			s.Kill(t.Context())
		}
		nw.waitClosed(t, "create "+strconv.Itoa(i))
		ids, err := b.Cleanup(t.Context())
		if err != nil {
			t.Errorf("Cleanup() = %v", err)
		}
		if slices.Contains(ids, id) {
			t.Errorf("create %d left %s behind", i, id)
		}
	}
}

// RunPoolNetwork runs the network case of a warm pool in front of the
// backend newBackend makes: a pooled sandbox attaches the pool's Network
// (warm.Target.Network) when the pool starts it, ahead of any create, and
// is deny-all there; once handed out, its owner opens that fence and the
// sandbox's traffic follows.
func RunPoolNetwork(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	t.Run("PooledSandboxFollowsItsOwner", func(t *testing.T) {
		f, allow, url := hostTarget(t)
		nw := &recNet{Net: f.New(nil)}
		p := warm.New(warm.Options{Backend: newBackend(t), Size: 1})
		t.Cleanup(func() { p.Close(context.Background()) })
		p.Start(warm.Target{RootFS: rootfs, Network: nw}, nil)
		if err := p.WaitReady(t.Context()); err != nil {
			t.Fatalf("WaitReady: %v", err)
		}
		if a, open, _, _ := nw.counts(); a != 1 || open != 1 {
			t.Fatalf("pooled sandbox: %d attaches, %d open; want the pool's Network attached once", a, open)
		}
		nw.mu.Lock()
		pooled := nw.ids[0]
		nw.mu.Unlock()
		// The create the pool serves names no ID and no network of its own.
		s, err := p.Create(t.Context(), isolation.Spec{RootFS: rootfs})
		if err != nil {
			t.Fatalf("Create() = %v", err)
		}
		t.Cleanup(func() { s.Kill(context.WithoutCancel(t.Context())) })
		if s.ID() != pooled {
			t.Fatalf("handed out %s, want the pooled %s", s.ID(), pooled)
		}
		if reaches(t, s, url) {
			t.Errorf("the handed-out sandbox reaches %s before its owner allowed it", url)
		}
		nw.SetPolicy(allow)
		if !reaches(t, s, url) {
			t.Errorf("the handed-out sandbox does not reach %s after its owner allowed it", url)
		}
		if err := p.Close(t.Context()); err != nil {
			t.Errorf("pool Close() = %v", err)
		}
		if err := s.Kill(t.Context()); err != nil {
			t.Fatalf("Kill() = %v", err)
		}
		waitDone(t, s, "after Kill")
		nw.waitClosed(t, "after Kill")
	})
}
