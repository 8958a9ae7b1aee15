package tun_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"net/netip"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/egress/tun"
)

func countDir(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestIdleStacksHoldNoThread starts stacks on TUN devices in namespaces of
// their own and leaves them idle: the device is read through the runtime's
// poller, so idle stacks add no OS thread blocked in a read (one each
// would be a thread per idle sandbox in the daemon). Closing them gives
// back every descriptor. The bounds are counts, with room for the
// runtime's own threads.
func TestIdleStacksHoldNoThread(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: creates network namespaces and TUN devices")
	}
	const n = 16
	p, err := policy.Compile(policy.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	// The namespaces first: their setup threads exit with their goroutines.
	var paths []string
	for range n {
		ns := newNetns(t)
		paths = append(paths, fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), ns))
	}
	time.Sleep(200 * time.Millisecond)
	threads0, fds0 := countDir(t, "/proc/self/task"), countDir(t, "/proc/self/fd")
	var stacks []*egress.Stack
	for i, path := range paths {
		fd, err := tun.Create(path, tun.Config{Addr: []netip.Prefix{egress.SandboxIPv4, egress.SandboxIPv6}})
		if err != nil {
			t.Fatalf("tun.Create: %v", err)
		}
		st, err := egress.New(context.Background(), egress.Options{SandboxID: fmt.Sprintf("idle%d", i), FD: fd, Policy: p, DNSUpstream: "127.0.0.1:9"})
		if err != nil {
			t.Fatalf("egress.New: %v", err)
		}
		stacks = append(stacks, st)
	}
	time.Sleep(time.Second) // the readers park
	threads := countDir(t, "/proc/self/task") - threads0
	t.Logf("%d idle stacks: %d more threads", n, threads)
	if threads >= n/2 {
		t.Errorf("%d idle stacks hold %d more OS threads, want fewer than %d", n, threads, n/2)
	}
	for _, st := range stacks {
		if err := st.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if fds := countDir(t, "/proc/self/fd") - fds0; fds > 0 {
		t.Errorf("%d descriptors left after closing the stacks", fds)
	}
}
