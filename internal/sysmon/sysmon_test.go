package sysmon

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/testutil"
)

// switches reads every thread's voluntary context switches.
func switches(t *testing.T) map[int]int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int{}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		raw, err := os.ReadFile("/proc/self/task/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(l, "voluntary_ctxt_switches:"); ok {
				out[tid], _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
	}
	return out
}

func slackOf(t *testing.T, tid int) int64 {
	t.Helper()
	v, err := readSlack("/proc", tid)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRelaxPicksSysmon tells sysmon by what it does, independently of how
// Relax finds it: while a goroutine sleeps in a system call, entered from
// a process otherwise idle (which wakes sysmon), sysmon alone wakes every
// 20 µs.
func TestRelaxPicksSysmon(t *testing.T) {
	testutil.RequireRoot(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	before := switches(t)
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
		_ = unix.Nanosleep(&unix.Timespec{Nsec: int64(8 * time.Millisecond)}, nil)
		time.Sleep(500 * time.Microsecond)
	}
	after := switches(t)
	woke := map[int]int{}
	busiest, most, next := 0, -1, -1
	for tid, n := range after {
		d := n - before[tid]
		woke[tid] = d
		if d > most {
			busiest, most, next = tid, d, most
		} else if d > next {
			next = d
		}
	}
	if most < 20 || most < 2*next {
		t.Fatalf("no thread stood out as sysmon beside system calls of 8 ms (wake-ups per thread: %v)", woke)
	}
	nominal := slackOf(t, busiest)
	const slack = 3 * time.Millisecond
	if err := Relax(context.Background(), "/proc", slack, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = writeSlack("/proc", busiest, nominal) })
	for tid := range switches(t) {
		got := slackOf(t, tid)
		if want := slack.Nanoseconds(); tid == busiest && got != want {
			t.Errorf("sysmon (thread %d, %d wake-ups) has slack %d ns, want %d", tid, most, got, want)
		} else if tid != busiest && got == slack.Nanoseconds() {
			t.Errorf("thread %d, not sysmon, was given sysmon's slack", tid)
		}
	}
}

// TestRelaxGivesInheritedSlackBack: a thread with sysmon's slack (as one
// the runtime started from sysmon has) gets the main thread's back.
func TestRelaxGivesInheritedSlackBack(t *testing.T) {
	testutil.RequireRoot(t)
	leader := os.Getpid()
	nominal := slackOf(t, leader)
	const slack = 7 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() { ended <- Relax(ctx, "/proc", slack, 10*time.Millisecond) }()
	var sysmonTID int
	deadline := time.Now().Add(10 * time.Second)
	for sysmonTID == 0 {
		for tid := range switches(t) {
			if slackOf(t, tid) == slack.Nanoseconds() {
				sysmonTID = tid
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("Relax set no thread's slack")
		}
		time.Sleep(time.Millisecond)
	}
	t.Cleanup(func() { _ = writeSlack("/proc", sysmonTID, nominal) })
	// A thread of this process other than sysmon and the main thread, as
	// if it had inherited sysmon's slack.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self := unix.Gettid()
	if self == sysmonTID {
		t.Fatal("the test's own thread is sysmon")
	}
	if err := writeSlack("/proc", self, slack.Nanoseconds()); err != nil {
		t.Fatal(err)
	}
	for slackOf(t, self) != nominal {
		if time.Now().After(deadline) {
			t.Fatalf("thread %d kept sysmon's slack", self)
		}
		time.Sleep(time.Millisecond)
	}
	if got := slackOf(t, sysmonTID); got != slack.Nanoseconds() {
		t.Errorf("sysmon's slack went back too: %d", got)
	}
	cancel()
	if err := <-ended; err != nil {
		t.Fatalf("Relax: %v", err)
	}
}

// TestForkGivesChildrenTheDefault: a child forked in Fork has the
// kernel's default slack, whatever its forking thread had.
func TestForkGivesChildrenTheDefault(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(2*time.Millisecond), 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	var (
		out []byte
		err error
	)
	Fork(func() { out, err = exec.Command("cat", "/proc/self/timerslack_ns").Output() })
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(out)), fmt.Sprint(ForkSlack.Nanoseconds()); got != want {
		t.Fatalf("the child's timer slack is %s ns, want %s", got, want)
	}
}

func TestTimedSleep(t *testing.T) {
	for line, want := range map[string]bool{
		"35 0xc000 0x0 0x0 0x0 0x0 0x0 0x7ffc 0x4000":             true,  // nanosleep
		"202 0xd787e0 0x80 0x0 0xcae482f7ea0 0x0 0x0 0xcae4 0x48": true,  // futex wait, private, timeout
		"202 0xd76e98 0x80 0x0 0x0 0x0 0x0 0x7ffc 0x48de23":       false, // futex wait, no timeout
		"202 0xd76e98 0x81 0x1 0x0 0x0 0x0 0x7ffc 0x48de23":       false, // futex wake
		"281 0x6 0x7ffd 0x80 0x927b9 0x0 0x0 0x7ffd 0x408fee":     false, // epoll_pwait
		"running":          false,
		"-1 0x7ffc 0x4000": false,
	} {
		if got := timedSleep(line); got != want {
			t.Errorf("timedSleep(%q) = %v, want %v", line, got, want)
		}
	}
}
