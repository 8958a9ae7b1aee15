package native_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestAgentThreadsHoldNoMore checks the sandbox's PID 1 from the host,
// thread by thread. The agent is not executed: the init becomes the agent,
// and a Go program runs on several threads, each with its own capability
// sets, no_new_privs, seccomp filter and cgroup namespace, any of which
// may start the next command. Every thread must hold exactly what a
// process of the sandbox started as its root holds, and the process no
// descriptor naming a host file beyond the standard streams it was given.
// The init starts with GOMAXPROCS=1 in its environment (nsinit.InitEnv):
// neither that nor anything else of the init's own environment reaches
// the sandbox's commands.
func TestInitEnvironmentStaysWithTheInit(t *testing.T) {
	testutil.RequireRoot(t)
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{})
	out := run(t, sb, "root", "/bin/sh", "-c", "env; cat /proc/self/environ; echo; echo done")
	if !strings.HasSuffix(out.stdout, "done\n") || !strings.Contains(out.stdout, "PATH=") {
		t.Fatalf("env: %+v", out)
	}
	if strings.Contains(out.stdout, "GOMAXPROCS") {
		t.Errorf("a command's environment holds the init's GOMAXPROCS: %q", out.stdout)
	}
}

func TestAgentThreadsHoldNoMore(t *testing.T) {
	testutil.RequireRoot(t)
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{})
	// Busy the agent on several commands at once, so that its runtime
	// has started every thread it is going to.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { run(t, sb, "root", "/bin/sh", "-c", "i=0; while [ $i -lt 300 ]; do i=$((i+1)); done") })
	}
	wg.Wait()
	root := statusFields(t, run(t, sb, "root", "/bin/cat", "/proc/self/status").stdout)
	if want := fmt.Sprintf("%016x", nsinit.KeptCaps()); root["CapBnd"] != want {
		t.Fatalf("a root command's CapBnd is %q, want %s", root["CapBnd"], want)
	}

	// The agent's executable is the host's file (the init was started
	// from it, not from the sandbox's /.fence/fence): the sandbox's root
	// must not learn its host path or reach it through /proc/1.
	peek := run(t, sb, "root", "/bin/sh", "-c",
		"readlink /proc/1/exe; head -c 4096 /proc/1/maps; ls -l /proc/1/fd/ /proc/1/map_files/ 2>&1; cat /proc/1/exe >/dev/null && echo READ; echo done")
	if !strings.HasSuffix(peek.stdout, "done\n") || strings.Contains(peek.stdout, "READ") ||
		strings.Contains(peek.stdout+peek.stderr, filepath.Dir(testutil.FenceBinary(t))) || strings.Contains(peek.stdout+peek.stderr, "/var/lib") {
		t.Errorf("the sandbox's root sees through /proc/1: %q %q", peek.stdout, peek.stderr)
	}

	pid := native.AgentPid(sb)
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) < 2 {
		t.Fatalf("the agent runs on %d thread(s); the test needs several", len(tasks))
	}
	hostNS, err := os.Readlink("/proc/self/ns/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var agentNS string
	for _, task := range tasks {
		dir := fmt.Sprintf("/proc/%d/task/%s", pid, task.Name())
		raw, err := os.ReadFile(dir + "/status")
		if err != nil {
			t.Fatal(err)
		}
		st := statusFields(t, string(raw))
		for k, want := range map[string]string{
			"CapEff": root["CapBnd"], "CapPrm": root["CapBnd"], "CapBnd": root["CapBnd"],
			"CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2", "Seccomp_filters": "1",
		} {
			if st[k] != want {
				t.Errorf("thread %s: %s %s, want %s", task.Name(), k, st[k], want)
			}
		}
		if inh := st["CapInh"]; inh != "0000000000000000" && inh != root["CapInh"] {
			t.Errorf("thread %s: CapInh %s", task.Name(), inh)
		}
		ns, err := os.Readlink(dir + "/ns/cgroup")
		if err != nil {
			t.Fatal(err)
		}
		if ns == hostNS {
			t.Errorf("thread %s is in the host's cgroup namespace", task.Name())
		}
		if agentNS == "" {
			agentNS = ns
		} else if ns != agentNS {
			t.Errorf("thread %s: cgroup namespace %s, another thread's %s", task.Name(), ns, agentNS)
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		switch {
		case strings.HasPrefix(target, "socket:"), strings.HasPrefix(target, "pipe:"),
			strings.HasPrefix(target, "anon_inode:"), target == "/dev/null",
			target == "/proc/1/oom_score_adj": // the agent's own, held (package process)
		default:
			t.Errorf("the agent holds descriptor %s: %s", fd.Name(), target)
		}
	}
}

// statusFields parses /proc/<pid>/status.
func statusFields(t *testing.T, s string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for line := range strings.Lines(s) {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// The spawner, a process of the host's root that only clones and starts
// inits, holds in its bounding set only what an init keeps or uses for
// its setup.
func TestSpawnerIsBounded(t *testing.T) {
	testutil.RequireRoot(t)
	b := newBackend(t)
	create(t, b, isolation.Spec{}) // the spawner runs by now
	pid := b.SpawnerPid()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	bnd, err := strconv.ParseUint(statusFields(t, string(status))["CapBnd"], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	for c, want := range map[int]bool{
		unix.CAP_SYS_ADMIN: true, unix.CAP_NET_ADMIN: true, unix.CAP_SETPCAP: true, unix.CAP_CHOWN: true,
		unix.CAP_SYS_MODULE: false, unix.CAP_SYS_PTRACE: false, unix.CAP_MKNOD: false, unix.CAP_NET_RAW: false,
		unix.CAP_BPF: false, unix.CAP_SYS_TIME: false, unix.CAP_DAC_READ_SEARCH: false,
	} {
		if got := bnd&(1<<c) != 0; got != want {
			t.Errorf("spawner's bounding set %#x: capability %d present = %v, want %v", bnd, c, got, want)
		}
	}
}
