package native_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/sysmon"
)

// threadSlacks reads the timer slack of every thread of process pid, in
// the order the threads were started (ids increase, wrapping at pid_max).
func threadSlacks(t *testing.T, pid int) (tids []int, slack map[int]int64) {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	slack = map[int]int64{}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/timerslack_ns", tid))
		if err != nil {
			continue // exited
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		tids = append(tids, tid)
		slack[tid] = v
	}
	order := func(tid int) int { return (tid - pid + 1<<22) % (1 << 22) }
	slices.SortFunc(tids, func(a, b int) int { return order(a) - order(b) })
	return tids, slack
}

// TestSandboxTimerSlack: a ready init gives its runtime's sysmon thread
// (the first it started) a relaxed timer slack while it waits, the agent
// keeps it, and every process the agent starts has the kernel's default
// slack, even when the agent's thread that forks it has sysmon's (as
// threads the runtime starts from sysmon do).
func TestSandboxTimerSlack(t *testing.T) {
	b := newBackendWith(t, native.Options{ReadyInits: 1})
	want := sysmon.Default.Nanoseconds()
	deadline := time.Now().Add(30 * time.Second)
	var ready int
	for ready == 0 {
		pids, err := b.ReadyGroupPids()
		if err != nil {
			t.Fatal(err)
		}
		for _, pid := range pids {
			if pid == b.SpawnerPid() {
				continue
			}
			if tids, slack := threadSlacks(t, pid); len(tids) > 1 && slack[tids[1]] == want {
				ready = pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ready init relaxed its sysmon thread (ready cgroup: %v)", pids)
		}
		time.Sleep(10 * time.Millisecond)
	}
	sb := create(t, b, isolation.Spec{})
	pid := native.AgentPid(sb)
	if pid != ready {
		t.Logf("the create took init %d, not %d", pid, ready)
	}
	tids, slack := threadSlacks(t, pid)
	if slack[tids[0]] == want || slack[tids[1]] != want {
		t.Fatalf("agent %d: main thread's slack %d, sysmon's %d; want sysmon alone at %d", pid, slack[tids[0]], slack[tids[1]], want)
	}
	// Every thread of the agent with sysmon's slack, as if the runtime had
	// started them all from sysmon.
	for _, tid := range tids {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/timerslack_ns", tid), []byte(strconv.FormatInt(want, 10)), 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, user := range []string{"root", "user"} {
		out := run(t, sb, user, "/bin/cat", "/proc/self/timerslack_ns")
		if got := strings.TrimSpace(out.stdout); got != strconv.FormatInt(sysmon.ForkSlack.Nanoseconds(), 10) {
			t.Errorf("a command of %s runs with timer slack %q ns, want the kernel's default %d", user, got, sysmon.ForkSlack.Nanoseconds())
		}
	}
}
