package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/testutil"
)

// agentAlive reports whether sb still answers: Get finds it and a command
// runs in it.
func agentAlive(t *testing.T, d *daemon, sb *client.Sandbox) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := d.Client.Get(ctx, sb.ID()); err != nil {
		return fmt.Errorf("Get: %w", err)
	}
	st, err := sb.Envd().Run(ctx, client.ProcessSpec{Cmd: "true"})
	if err != nil {
		return fmt.Errorf("running true: %w", err)
	}
	if st.ExitCode != 0 {
		return fmt.Errorf("true exited %+v", st)
	}
	return nil
}

// TestSignalsToAgent proves that the sandbox's root cannot end its sandbox
// by signalling the agent (PID 1): every signal whose Go default would end
// the agent is ignored, and the sandbox keeps answering. Root: the daemon
// creates namespaces and cgroups.
func TestSignalsToAgent(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	for _, sig := range []string{"TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "ALRM", "PIPE", "ABRT", "XCPU", "SYS", "TRAP"} {
		out, errs, st := run(t, sb.Envd(), client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "kill -" + sig + " 1"}, User: "root"})
		if st.ExitCode != 0 {
			t.Errorf("kill -%s 1 as root: exit %d (%q %q)", sig, st.ExitCode, out, errs)
		}
		time.Sleep(100 * time.Millisecond) // let a dying agent die
		if err := agentAlive(t, d, sb); err != nil {
			t.Fatalf("after kill -%s 1 inside the sandbox: %v", sig, err)
		}
	}
}

// TestShmInodeLimit proves that /dev/shm has an inode limit as well as a
// size limit: creating empty files (which take no page of the size limit)
// fails with ENOSPC long before they could pin the sandbox's memory. Root:
// the daemon creates namespaces and cgroups.
func TestShmInodeLimit(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	// 100,000 files would be about 100 MiB of inodes and dentries with no
	// inode limit; the limit stops it at 16,384.
	out := sh(t, sb.Envd(), `cd /dev/shm && i=0; while [ $i -lt 100000 ]; do { true > f$i; } 2>/dev/null || break; i=$((i+1)); done; echo $i; df -i /dev/shm | tail -1`)
	fields := strings.Fields(out)
	n, err := strconv.Atoi(fields[0])
	if err != nil {
		t.Fatalf("output %q", out)
	}
	t.Logf("empty files created in /dev/shm: %d (%s)", n, strings.TrimSpace(out))
	if n >= 100000 || n < 1000 {
		t.Errorf("created %d empty files in /dev/shm; want the inode limit (16,384) to stop it", n)
	}
	if err := agentAlive(t, d, sb); err != nil {
		t.Fatal(err)
	}
}

// oomScore reads /proc/PID/oom_score_adj on the host.
func oomScore(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
	if err != nil {
		t.Fatalf("reading oom_score_adj of %d: %v", pid, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOOMKillsWorkerNotAgent proves that when a sandbox runs out of memory
// the kernel kills a worker, not the agent: the agent's oom_score_adj is
// below every process it starts (and the sandbox's root cannot lower its
// workers below the agent's), parallel workers that together exceed the
// limit lose members to the OOM killer, the command that was killed
// reports exit by SIGKILL, and the sandbox keeps answering. Root: the
// daemon creates namespaces and cgroups; the test reads the sandbox's
// processes from the host.
func TestOOMKillsWorkerNotAgent(t *testing.T) {
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	mem := int64(256)
	sb := d.create(t, api.NewSandbox{TemplateID: "base", MemoryMB: &mem})
	e := sb.Envd()

	agent := agentPID(t, sb.ID())
	agentAdj := oomScore(t, agent)
	out := sh(t, e, "cat /proc/self/oom_score_adj")
	childAdj, _ := strconv.Atoi(strings.TrimSpace(out))
	t.Logf("oom_score_adj: agent %d, its commands %d", agentAdj, childAdj)
	if childAdj <= agentAdj {
		t.Errorf("a command's oom_score_adj = %d, want above the agent's %d", childAdj, agentAdj)
	}
	// The sandbox's root cannot take a worker below the agent.
	_, _, st := run(t, e, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", fmt.Sprintf("echo %d > /proc/self/oom_score_adj", agentAdj-1)}, User: "root"})
	if st.ExitCode == 0 && agentAdj > -1000 {
		t.Errorf("root inside set its oom_score_adj to %d, below the agent's %d", agentAdj-1, agentAdj)
	}

	// Sixty workers of ~6 MiB each (plus the interpreter) in 256 MiB.
	workers := `import os, time
pids = []
for i in range(60):
    pid = os.fork()
    if pid == 0:
        b = bytearray(6 << 20)
        for j in range(0, len(b), 4096):
            b[j] = 1
        time.sleep(5)
        os._exit(0)
    pids.append(pid)
killed = 0
for p in pids:
    _, st = os.waitpid(p, 0)
    if os.WIFSIGNALED(st) and os.WTERMSIG(st) == 9:
        killed += 1
print("killed", killed)
`
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var stdout strings.Builder
	st, err := e.Run(ctx, client.ProcessSpec{Cmd: "python3", Args: []string{"-c", workers}, Stdout: &stdout, Timeout: 100 * time.Second})
	t.Logf("workers: %+v, %v, stdout %q", st, err, stdout.String())
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		// The stream itself must survive: only workers die.
		t.Errorf("running the workers: %v", err)
	}
	if !strings.HasPrefix(stdout.String(), "killed ") || strings.TrimSpace(stdout.String()) == "killed 0" {
		t.Errorf("workers printed %q, want some of them killed by the OOM killer", stdout.String())
	}
	if aerr := agentAlive(t, d, sb); aerr != nil {
		t.Fatalf("sandbox after the workers ran out of memory: %v", aerr)
	}
	if got := agentPID(t, sb.ID()); got != agent {
		t.Fatalf("agent pid %d, was %d", got, agent)
	}

	// A single command that grows until the limit reports exit by SIGKILL.
	hog := `b = []
while True:
    b.append(bytearray(8 << 20))
    for j in range(0, 8 << 20, 4096):
        b[-1][j] = 1
`
	st, err = e.Run(ctx, client.ProcessSpec{Cmd: "python3", Args: []string{"-c", hog}})
	if err != nil {
		t.Fatalf("running the memory hog: %v", err)
	}
	if sig, ok := st.Signal(); !ok || sig != syscall.SIGKILL || st.Status != "signal: killed" {
		t.Errorf("memory hog ended %+v, want killed by SIGKILL (status \"signal: killed\")", st)
	}
	if err := agentAlive(t, d, sb); err != nil {
		t.Fatalf("sandbox after the memory hog: %v", err)
	}
}

// agentPID returns the host pid of sandbox id's agent: the process of its
// cgroup whose parent is outside it.
func agentPID(t *testing.T, id string) int {
	t.Helper()
	procs := sandboxProcs(t, id)
	in := map[int]bool{}
	for _, p := range procs {
		in[p.PID] = true
	}
	for _, p := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		ppid, _ := strconv.Atoi(f[1])
		if !in[ppid] && runnable(p.PID) {
			return p.PID
		}
	}
	t.Fatalf("no agent among the processes of %s: %v", id, procs)
	return 0
}

// TestKillEndsSession proves that killing a command through the API ends
// every process of its session, also those in process groups of their
// own (job control), so nothing it started keeps running. Root: the
// daemon creates namespaces and cgroups; the test reads the sandbox's
// processes from the host.
func TestKillEndsSession(t *testing.T) {
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{TemplateID: "base"})
	e := sb.Envd()
	before := len(sandboxProcs(t, sb.ID()))
	ctx := ctxT(t)
	// setpgid: a process group of its own, as job control makes one for
	// every background job.
	const ownGroup = `python3 -c 'import os; os.setpgid(0, 0); os.execvp("sleep", ["sleep", "1002"])'`
	scripts := []struct {
		script string
		sleeps int
	}{
		{"sleep 1000 & sleep 1001 & wait", 2},
		{"sleep 1000 & " + ownGroup + " & (" + ownGroup + " & wait) & wait", 3},
	}
	for _, tt := range scripts {
		script := tt.script
		p, err := e.Start(ctx, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", script}})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		eventually(t, 10*time.Second, "the sleeps started", func() bool { return sleepers(t, sb.ID()) == tt.sleeps })
		if err := p.Signal(ctx, syscall.SIGKILL); err != nil {
			t.Fatalf("Signal(SIGKILL): %v", err)
		}
		st, err := p.Wait()
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if sig, ok := st.Signal(); !ok || sig != syscall.SIGKILL {
			t.Errorf("%q after kill = %+v, want killed by SIGKILL", script, st)
		}
		eventually(t, 10*time.Second, fmt.Sprintf("every process of %q gone", script), func() bool {
			return len(sandboxProcs(t, sb.ID())) == before
		})
	}
}

// sleepers counts the processes of sandbox id running sleep.
func sleepers(t *testing.T, id string) int {
	n := 0
	for _, p := range sandboxProcs(t, id) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p.PID)); err == nil && strings.TrimSpace(string(b)) == "sleep" {
			n++
		}
	}
	return n
}

// gate is a writer that blocks until opened, then counts what it gets.
type gate struct {
	open <-chan struct{}
	n    atomic.Int64
}

func (g *gate) Write(p []byte) (int, error) {
	<-g.open
	g.n.Add(int64(len(p)))
	return len(p), nil
}

// vmRSS reads VmRSS of host pid in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading status of %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS for %d", pid)
	return 0
}

// TestOutputFloodSlowReaders proves that the agent's memory for queued
// output is bounded across streams: 150 commands that print fast to
// clients that do not read hold the agent's RSS under its output budget
// (32 MiB) plus a documented allowance for its own code and heap (64 MiB),
// the processes are held back meanwhile, and once the clients read, every
// byte arrives. Root: the daemon creates namespaces and cgroups; the test
// reads the agent's memory from the host.
func TestOutputFloodSlowReaders(t *testing.T) {
	const (
		procs     = 150
		perProc   = 16 << 20 // more than a client and the sockets to it absorb (about 10 MiB)
		rssBound  = (32 + 64) << 20
		blockTime = 15 * time.Second
	)
	d := startDaemon(t, newDataDir(t))
	cpus := 2.0
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal", CPUCount: &cpus})
	// The clients talk to the agent's socket directly, so that what they
	// do not read backs up into the agent rather than into the daemon's
	// and this host's TCP buffers (which hold megabytes per connection).
	sock := filepath.Join(d.DataDir, "native", "sock", instanceOf(d.DataDir), sb.ID()+".sock")
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", sock)
	}, MaxIdleConnsPerHost: procs}
	defer tr.CloseIdleConnections()
	e := client.NewEnvd(&http.Client{Transport: tr}, "http://agent", http.Header{})
	agent := agentPID(t, sb.ID())
	idle := vmRSS(t, agent) // the agent's binary and runtime, before any stream
	open := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(open) }) }
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	gates := make([]*gate, procs)
	ps := make([]*client.Process, procs)
	for i := range procs {
		gates[i] = &gate{open: open}
		p, err := e.Start(ctx, client.ProcessSpec{Cmd: "head", Args: []string{"-c", strconv.Itoa(perProc), "/dev/zero"}, Stdout: gates[i]})
		if err != nil {
			t.Fatalf("Start %d: %v", i, err)
		}
		ps[i] = p
	}
	var peak, daemonPeak int64
	deadline := time.Now().Add(blockTime)
	for time.Now().Before(deadline) {
		peak = max(peak, vmRSS(t, agent))
		daemonPeak = max(daemonPeak, vmRSS(t, d.cmd.Process.Pid))
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("VmRSS peaks while %d streams did not read: agent %d MiB (%d MiB idle), daemon %d MiB; written by the commands meanwhile: %d MiB",
		procs, peak>>20, idle>>20, daemonPeak>>20, written(t, sb.ID())>>20)
	var delivered int64
	for _, g := range gates {
		delivered += g.n.Load()
	}
	t.Logf("delivered to the clients meanwhile: %d bytes", delivered)
	if grow := peak - idle; grow > rssBound {
		t.Errorf("agent VmRSS grew by %d MiB (peak %d MiB), want at most %d MiB", grow>>20, peak>>20, rssBound>>20)
	}
	release()
	for i, p := range ps {
		st, err := p.Wait()
		if err != nil || st.ExitCode != 0 {
			t.Errorf("process %d: %+v, %v", i, st, err)
			continue
		}
		if got := gates[i].n.Load(); got != perProc {
			t.Errorf("process %d: %d bytes arrived, want %d", i, got, perProc)
		}
	}
	if err := agentAlive(t, d, sb); err != nil {
		t.Fatal(err)
	}
}

// written sums wchar of sandbox id's processes other than its agent.
func written(t *testing.T, id string) int64 {
	agent := agentPID(t, id)
	var n int64
	for _, p := range sandboxProcs(t, id) {
		if p.PID == agent {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", p.PID))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "wchar: "); ok {
				w, _ := strconv.ParseInt(v, 10, 64)
				n += w
			}
		}
	}
	return n
}

// TestFilesAsUserInSandbox proves, in a real sandbox of each backend, that
// the file API acts as the requesting user: the sandbox's plain user
// plants symlinks to root's files in its home, and an upload or download
// through the API as that user neither writes /etc/passwd nor reads
// /etc/shadow, while an upload to its own home works and is the user's
// (gVisor has no setfsuid: the agent takes the user's effective IDs on a
// thread of its own there). Root: the daemon creates namespaces and
// cgroups.
func TestFilesAsUserInSandbox(t *testing.T) {
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	for _, backend := range []string{"native", "gvisor"} {
		t.Run(backend, func(t *testing.T) {
			if backend == "gvisor" {
				testutil.RequireRunsc(t)
			}
			filesAsUser(t, d, map[string]string{"fence.backend": backend})
		})
	}
}

func filesAsUser(t *testing.T, d *daemon, meta map[string]string) {
	sb := d.create(t, api.NewSandbox{TemplateID: "base", Metadata: meta})
	e := sb.Envd()
	ctx := ctxT(t)
	if err := e.WithUser("user").WriteFile(ctx, "/home/user/mine", strings.NewReader("mine\n")); err != nil {
		t.Fatalf("upload as user to its home: %v", err)
	}
	if got := sh(t, e.WithUser("root"), "stat -c %U /home/user/mine; cat /home/user/mine"); got != "user\nmine\n" {
		t.Errorf("uploaded file: %q, want owned by user", got)
	}
	sh(t, e.WithUser("user"), "ln -s /etc/passwd /home/user/p && ln -s /etc/shadow /home/user/s && ln -s /etc /home/user/etc")
	before := sh(t, e.WithUser("root"), "sha256sum /etc/passwd")
	for _, p := range []string{"/home/user/p", "/home/user/etc/passwd", "/home/user/etc/planted"} {
		if err := e.WithUser("user").WriteFile(ctx, p, strings.NewReader("owned::0:0::/:/bin/sh\n")); err == nil {
			t.Errorf("upload as user to %s (a symlink into /etc) succeeded", p)
		}
	}
	if after := sh(t, e.WithUser("root"), "sha256sum /etc/passwd; ls /etc/planted 2>&1 || true"); !strings.HasPrefix(after, before) || !strings.Contains(after, "No such file") {
		t.Errorf("/etc after uploads through symlinks: %q, want /etc/passwd unchanged (%q) and no /etc/planted", after, before)
	}
	for _, p := range []string{"/home/user/s", "/home/user/etc/shadow"} {
		rc, err := e.WithUser("user").ReadFile(ctx, p)
		if err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			t.Errorf("download as user of %s (a symlink to /etc/shadow) = %q, want refused", p, b)
		}
	}
	// Root still reads root's file.
	rc, err := e.WithUser("root").ReadFile(ctx, "/home/user/s")
	if err != nil {
		t.Fatalf("download as root: %v", err)
	}
	rc.Close()
}
