package hostaddr

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/testutil"
)

const helperEnv = "FENCE_HOSTADDR_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "watch" {
		if err := helperWatch(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("ok")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestStatic(t *testing.T) {
	s := Static(netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("::ffff:192.0.2.2"), netip.MustParseAddr("fe80::1%eth0"))
	for _, a := range []string{"192.0.2.1", "192.0.2.2", "::ffff:192.0.2.1", "fe80::1", "fe80::1%lo"} {
		if !s.Contains(netip.MustParseAddr(a)) {
			t.Errorf("Contains(%s) = false", a)
		}
	}
	if s.Contains(netip.MustParseAddr("192.0.2.3")) {
		t.Error("Contains(192.0.2.3) = true")
	}
	var nilSet *Set
	if nilSet.Contains(netip.MustParseAddr("192.0.2.1")) || nilSet.Close() != nil {
		t.Error("a nil set is not empty")
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close of a static set: %v", err)
	}
}

// TestWatchFollowsChanges adds and removes addresses in a network namespace
// of its own after the watch started: the set follows both.
func TestWatchFollowsChanges(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("ip (iproute2) is needed: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=watch")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("watch helper: %v: %s", err, out)
	}
}

func helperWatch() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := Watch(ctx)
	if err != nil {
		return err
	}
	ip := func(args ...string) error {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := ip("link", "set", "lo", "up"); err != nil {
		return err
	}
	v4, v6 := netip.MustParseAddr("198.51.100.77"), netip.MustParseAddr("2001:db8:77::1")
	if s.Contains(v4) || s.Contains(v6) {
		return fmt.Errorf("addresses present before they were added: %v", s.Addrs())
	}
	wait := func(a netip.Addr, want bool) error {
		start := time.Now()
		for s.Contains(a) != want {
			if time.Since(start) > 10*time.Second {
				return fmt.Errorf("Contains(%s) still %v after 10s: %v", a, !want, s.Addrs())
			}
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	}
	if err := ip("addr", "add", "198.51.100.77/32", "dev", "lo"); err != nil {
		return err
	}
	if err := ip("-6", "addr", "add", "2001:db8:77::1/128", "dev", "lo", "nodad"); err != nil {
		return err
	}
	for _, a := range []netip.Addr{v4, v6} {
		if err := wait(a, true); err != nil {
			return err
		}
	}
	if err := ip("addr", "del", "198.51.100.77/32", "dev", "lo"); err != nil {
		return err
	}
	if err := wait(v4, false); err != nil {
		return err
	}
	// After Close the set stays as it was and the goroutine is gone.
	if err := s.Close(); err != nil {
		return fmt.Errorf("Close: %w", err)
	}
	if err := s.Close(); err != nil {
		return fmt.Errorf("second Close: %w", err)
	}
	if !s.Contains(v6) {
		return fmt.Errorf("Close emptied the set")
	}
	return nil
}
