package native_test

// These tests prove the native backend's isolation by attacking it from
// inside real sandboxes. They need root: they create user namespaces with
// mapped host uid ranges, cgroups and mounts.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/api/envd/process/processconnect"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/isolation/warm"
	"github.com/fencesandbox/fence/internal/selftest"
	"github.com/fencesandbox/fence/internal/selftest/probe"
	"github.com/fencesandbox/fence/internal/testutil"

	"golang.org/x/sys/unix"
)

func newBackend(t *testing.T) *native.Backend {
	t.Helper()
	return newBackendWith(t, native.Options{})
}

// newBackendWith is newBackend with options; the state directory, instance
// and executable are the test's.
func newBackendWith(t *testing.T, opts native.Options) *native.Backend {
	t.Helper()
	testutil.RequireRoot(t)
	dir := testutil.StateDir(t)
	opts.StateDir = filepath.Join(dir, "state")
	opts.Instance = "test" + strings.ToLower(strings.NewReplacer("/", "", "_", "").Replace(t.Name()))
	opts.Executable = testutil.FenceBinary(t)
	if opts.Logger == nil {
		// What a sandbox's init and agent print on stderr before dying
		// shows up with a failure.
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if opts.Network == nil {
		opts.Network = isolationtest.Network(nil)
	}
	b, err := native.New(t.Context(), opts)
	if err != nil {
		t.Fatalf("native.New: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if _, err := b.Cleanup(ctx); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
		b.Close()
	})
	return b
}

// TestLayersConformance runs the isolation.Layers cases on native
// sandboxes.
func TestLayersConformance(t *testing.T) {
	testutil.RequireRoot(t)
	forStores(t, func(t *testing.T, opts native.Options) {
		isolationtest.RunLayers(t, func(t *testing.T) isolation.Backend { return newBackendWith(t, opts) }, testutil.RootFS(t, "minimal"))
	})
}

// TestConformance runs every suite native's capabilities allow:
// isolationtest.RunAll (layers on the default store).
func TestConformance(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	isolationtest.RunAll(t, func(t *testing.T) isolation.Backend { return newBackend(t) }, rootfs)
}

// TestPauseConformance runs the isolation.Pauser cases on sandboxes handed
// out by a warm pool in front of the backend (the daemon's default setup).
func TestPauseConformance(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "minimal")
	t.Run("WarmPool", func(t *testing.T) {
		isolationtest.RunPause(t, func(t *testing.T) isolation.Backend {
			// The pool's fills log their failures, and a pool that never
			// fills fails the test rather than hanging it.
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			p := warm.New(warm.Options{Backend: newBackend(t), Size: 1, Logger: log})
			p.Start(warm.Target{RootFS: rootfs}, nil)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			if err := p.WaitReady(ctx); err != nil {
				t.Fatalf("WaitReady: %v (the pool's fills never gave a sandbox; their errors are logged above)", err)
			}
			t.Cleanup(func() { p.Close(context.Background()) })
			return p
		}, rootfs)
	})
}

type result struct {
	stdout, stderr string
	exit           int32
	status         string
}

// run runs argv in sb as user and returns what it printed and its exit.
func run(t *testing.T, sb isolation.Sandbox, user string, argv ...string) result {
	t.Helper()
	return runIn(t, sb, user, "", argv...)
}

// runIn is run with a working directory ("" = the user's default).
func runIn(t *testing.T, sb isolation.Sandbox, user, cwd string, argv ...string) result {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return sb.DialAgent(ctx) },
	}}
	c := processconnect.NewProcessClient(hc, "http://agent", connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	stdin := false
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: argv[0], Args: argv[1:], Cwd: &cwd},
		Stdin:   &stdin,
	})
	req.Header().Set("Authorization", "Basic "+basic(user))
	stream, err := c.Start(ctx, req)
	if err != nil {
		t.Fatalf("Start(%q): %v", argv, err)
	}
	defer stream.Close()
	var out, errb bytes.Buffer
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			errb.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			return result{stdout: out.String(), stderr: errb.String(), exit: end.GetExitCode(), status: end.GetStatus()}
		}
	}
	t.Fatalf("Start(%q): stream ended without exit: %v (stdout %q stderr %q)", argv, stream.Err(), out.String(), errb.String())
	return result{}
}

func basic(user string) string {
	return map[string]string{"root": "cm9vdDo=", "user": "dXNlcjo=", "nobody": "bm9ib2R5Og=="}[user]
}

func create(t *testing.T, b *native.Backend, spec isolation.Spec) isolation.Sandbox {
	t.Helper()
	if spec.ID == "" {
		spec.ID = strings.ToLower(fmt.Sprintf("t%d", time.Now().UnixNano()))
	}
	if spec.RootFS == "" {
		spec.RootFS = testutil.RootFS(t, "minimal")
	}
	sb, err := b.Create(t.Context(), spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", spec.ID, err)
	}
	t.Cleanup(func() {
		if err := sb.Kill(context.Background()); err != nil {
			t.Errorf("Kill: %v", err)
		}
	})
	return sb
}

// probeArgv runs one of package probe's checks: the fence binary the
// backend mounts in every sandbox, in its probe role.
func probeArgv(check string, args ...string) []string {
	return append(append(append([]string(nil), selftest.ProbeCommand...), check), args...)
}

// TestAttacks runs every attack probe of package probe from inside a
// sandbox, as sandbox root (the strongest user a sandbox has), through
// package selftest, as `fence selftest` does: the network checks also
// require the refusal on the stack's record and a silent host listener.
func TestAttacks(t *testing.T) {
	flows := selftest.NewFlowLog()
	b := newBackendWith(t, native.Options{Network: isolationtest.Network(flowRecorder{flows})})
	limits := isolation.Limits{MemoryBytes: 128 << 20, Pids: 128}
	sb := create(t, b, isolation.Spec{Limits: limits})
	exec, closeExec := selftest.AgentExec(sb.DialAgent)
	defer closeExec()
	rep, err := selftest.Run(t.Context(), selftest.Options{
		Exec: exec, MemoryBytes: limits.MemoryBytes, Pids: limits.Pids, Flows: flows,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != len(probe.Checks()) {
		t.Errorf("%d results for %d checks", len(rep.Results), len(probe.Checks()))
	}
	for _, r := range rep.Results {
		t.Run(r.Name, func(t *testing.T) {
			if !r.Pass {
				t.Error(r)
			}
		})
	}
}

// TestAttacksSeeAMissingFilter proves that the probes can fail: in a
// sandbox whose backend installs no seccomp filter (Options.NoSeccomp, a
// switch of the Go API only), the checks that only the filter stands
// behind must fail, and the run with them. The attacks it lets through
// are harmless ones (a keyring ID, a vsock socket left unconnected, an
// x32 getpid, a user namespace for /.fence/fence, io_uring with no
// parameters).
func TestAttacksSeeAMissingFilter(t *testing.T) {
	b := newBackendWith(t, native.Options{NoSeccomp: true})
	limits := isolation.Limits{MemoryBytes: 64 << 20, Pids: 64}
	sb := create(t, b, isolation.Spec{Limits: limits})
	exec, closeExec := selftest.AgentExec(sb.DialAgent)
	defer closeExec()
	rep, err := selftest.Run(t.Context(), selftest.Options{Exec: exec, MemoryBytes: limits.MemoryBytes, Pids: limits.Pids})
	if err != nil {
		t.Fatal(err)
	}
	failed := map[string]string{}
	for _, r := range rep.Results {
		if !r.Pass {
			failed[r.Name] = r.Detail
		}
	}
	for _, name := range []string{"seccomp", "keyctl", "userns", "io_uring", "bpf", "perf", "tiocsti", "setid", "vsock", "x32", "msg-oob", "sockets"} {
		if _, ok := failed[name]; !ok {
			t.Errorf("%s passed without a seccomp filter", name)
		}
	}
	for _, name := range []string{"uid", "caps", "no-new-privs", "proc-sys-ro", "devices", "fds", "pids-limit", "memory-limit"} {
		if d, ok := failed[name]; ok {
			t.Errorf("%s failed, but the filter is not what it checks: %s", name, d)
		}
	}
	if rep.OK() {
		t.Error("report OK without a seccomp filter")
	}
	t.Logf("without a filter: %s; failed: %v", rep.Summary(), failed)
}

// flowRecorder feeds a selftest.FlowLog from the sandboxes' network stacks.
type flowRecorder struct{ log *selftest.FlowLog }

func (r flowRecorder) Record(_ context.Context, ev egress.FlowEvent) {
	r.log.Record(selftest.Flow{Proto: ev.Proto, Dst: ev.Dst, Name: ev.Name, Allowed: ev.Allowed, Reason: ev.Reason})
}

func TestProcessesInvisible(t *testing.T) {
	b := newBackend(t)
	a := create(t, b, isolation.Spec{})
	other := create(t, b, isolation.Spec{})
	// A process in the other sandbox with a recognisable command line.
	run(t, other, "root", "/bin/sh", "-c", "sleep 31337 >/dev/null 2>&1 &")
	host := exec.Command("sleep", "31338")
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	defer host.Process.Kill()
	r := run(t, a, "root", "/bin/sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; ls /proc | grep -c '^[0-9]'")
	if strings.Contains(r.stdout, "31337") || strings.Contains(r.stdout, "31338") {
		t.Errorf("other sandbox's or host's processes visible: %q", r.stdout)
	}
	r = run(t, a, "root", "/bin/sh", "-c", "echo $$; hostname")
	if !strings.Contains(r.stdout, a.ID()) {
		t.Errorf("hostname = %q, want the sandbox id %s", r.stdout, a.ID())
	}
}

func TestTemplateUnwritable(t *testing.T) {
	b := newBackend(t)
	rootfs := testutil.RootFS(t, "minimal")
	before, err := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	a := create(t, b, isolation.Spec{})
	r := run(t, a, "root", "/bin/sh", "-c", "echo pwned >> /etc/passwd && rm -f /bin/ls && touch /newfile && echo done")
	if !strings.Contains(r.stdout, "done") {
		t.Fatalf("writes inside the sandbox's own layer failed: %+v", r)
	}
	after, _ := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
	if !bytes.Equal(before, after) {
		t.Errorf("template /etc/passwd changed on the host")
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "bin/ls")); err != nil {
		t.Errorf("template /bin/ls removed on the host: %v", err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "newfile")); err == nil {
		t.Errorf("file created in the template on the host")
	}
	other := create(t, b, isolation.Spec{})
	r = run(t, other, "root", "/bin/sh", "-c", "grep -c pwned /etc/passwd; ls /bin/ls")
	if strings.HasPrefix(r.stdout, "1") || !strings.Contains(r.stdout, "/bin/ls") {
		t.Errorf("another sandbox sees the first one's changes: %q", r.stdout)
	}
}

func TestDevNodes(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{})
	r := run(t, sb, "root", "/bin/sh", "-c", "ls -l /dev/ptmx /dev/fd/ /dev/stdin >/dev/null && echo links-ok; ls /dev | tr '\\n' ' '")
	if !strings.Contains(r.stdout, "links-ok") {
		t.Errorf("/dev symlinks missing: %+v", r)
	}
	for _, unwanted := range []string{"sda", "vda", "kmsg", "mem", "loop", "net", "vsock", "kvm"} {
		for _, f := range strings.Fields(r.stdout) {
			if f == unwanted {
				t.Errorf("host device /dev/%s visible in the sandbox", f)
			}
		}
	}
}

func TestUserSwitch(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{})
	if r := run(t, sb, "user", "/bin/sh", "-c", "id -u; echo $HOME; touch /etc/x"); !strings.HasPrefix(r.stdout, "1000\n/home/user") || r.exit == 0 {
		t.Errorf("as user: %+v, want uid 1000, home /home/user and no write to /etc", r)
	}
	if r := run(t, sb, "root", "/bin/sh", "-c", "id -u"); strings.TrimSpace(r.stdout) != "0" {
		t.Errorf("as root: id -u = %q", r.stdout)
	}
}

func TestPidsLimitHoldsForkBomb(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{Limits: isolation.Limits{Pids: 64}})
	r := run(t, sb, "root", "/bin/sh", "-c", "i=0; while [ $i -lt 200 ]; do sleep 3 & i=$((i+1)); done; echo looped")
	if !strings.Contains(r.stderr, "fork") {
		t.Errorf("no fork failure reported by the shell (stdout %q, stderr %q)", r.stdout, r.stderr)
	}
	st, err := sb.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Pids > 64 || st.Pids < 10 {
		t.Errorf("cgroup pids = %d after the fork loop, want the limit to hold it at ≤ 64", st.Pids)
	}
	// Once the sleeps end the sandbox works again: the agent's own tasks
	// (its threads, spares included) are all that is left.
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, _ := sb.Stats(t.Context())
		if st.Pids < 16 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pids still %d", st.Pids)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r := run(t, sb, "root", "/bin/echo", "alive"); strings.TrimSpace(r.stdout) != "alive" {
		t.Errorf("after the fork loop: %+v", r)
	}
}

func TestMemoryBalloonKilledInside(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{Limits: isolation.Limits{MemoryBytes: 64 << 20}})
	r := run(t, sb, "root", probeArgv("memory-limit", strconv.Itoa(64<<20))...)
	if r.exit == 0 || !strings.Contains(r.status, "killed") {
		t.Errorf("balloon: exit %d status %q, want killed", r.exit, r.status)
	}
	// The agent survived the OOM kill of its child.
	if r := run(t, sb, "root", "/bin/echo", "alive"); strings.TrimSpace(r.stdout) != "alive" {
		t.Errorf("after OOM: %+v", r)
	}
}

func TestDiskLimit(t *testing.T) { forStores(t, testDiskLimit) }

func testDiskLimit(t *testing.T, opts native.Options) {
	b := newBackendWith(t, opts)
	sb := create(t, b, isolation.Spec{Limits: isolation.Limits{DiskBytes: 16 << 20}})
	r := run(t, sb, "root", "/bin/sh", "-c", "dd if=/dev/zero of=/big bs=1M count=64 2>&1; echo rc=$?")
	if !strings.Contains(r.stdout, "rc=1") || !(strings.Contains(r.stdout, "quota") || strings.Contains(r.stdout, "space")) {
		t.Errorf("64 MiB write under a 16 MiB disk limit: %q", r.stdout)
	}
	st, _ := sb.Stats(t.Context())
	if st.DiskBytes > 17<<20 || st.DiskBytes < 8<<20 {
		t.Errorf("disk usage %d after filling a 16 MiB disk: want the filled size, within the limit", st.DiskBytes)
	}
	// The layer is mounted in the sandbox's namespace only: the host's
	// mount table does not grow with the sandboxes (every new sandbox's
	// namespace would copy it).
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), sb.ID()) {
		t.Errorf("the host's mount table holds sandbox %s's writable layer:\n%s", sb.ID(), mi)
	}
}

func TestBindReadOnly(t *testing.T) {
	b := newBackend(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "f"), []byte("host"), 0o644)
	sb := create(t, b, isolation.Spec{Binds: []isolation.Bind{
		{HostPath: dir, Path: "/ro", ReadOnly: true},
	}})
	r := run(t, sb, "root", "/bin/sh", "-c", "cat /ro/f; echo x > /ro/f; echo rc=$?")
	if !strings.HasPrefix(r.stdout, "host") || !strings.Contains(r.stdout, "rc=1") {
		t.Errorf("read-only bind: %q", r.stdout)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "host" {
		t.Errorf("host file changed through a read-only bind: %q", b)
	}
}

// TestBindRootOwned proves that the backend itself (not only the CLI)
// binds a root user's project writable with root as the sandbox's user
// (what the user writes lands owned by root, the sandbox's root creates
// nothing), refuses a source that would hand over the host or fence's
// state, and does not follow a symlink given as the source.
func TestBindRootOwned(t *testing.T) {
	b := newBackend(t)
	rootfs := testutil.RootFS(t, "minimal")
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	sb := create(t, b, isolation.Spec{Binds: []isolation.Bind{{HostPath: dir, Path: "/w"}}})
	r := run(t, sb, "user", "/bin/sh", "-c", "echo hi > /w/f; echo rc=$?")
	if !strings.Contains(r.stdout, "rc=0") {
		t.Errorf("the sandbox's user writing into a bind of root's: %q", r.stdout)
	}
	if st, err := os.Stat(filepath.Join(dir, "f")); err != nil || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("DIR/f: %v; want it written and owned by root", err)
	}
	r = run(t, sb, "root", "/bin/sh", "-c", "touch /w/g; echo rc=$?")
	if !strings.Contains(r.stdout, "rc=1") {
		t.Errorf("the sandbox's root creating a file in a bind of root's: %q, want a failure", r.stdout)
	}
	// Without CAP_SETFCAP: a file capability given there would be host
	// root's (TestRunBindRootProject proves the attack fails).
	r = run(t, sb, "root", "/bin/sh", "-c", "grep CapBnd /proc/self/status")
	if want := fmt.Sprintf("%016x", nsinit.KeptCaps()&^(1<<unix.CAP_SETFCAP)); !strings.Contains(r.stdout, want) {
		t.Errorf("the sandbox's root with a writable bind of root's: %q, want CapBnd %s (no CAP_SETFCAP)", r.stdout, want)
	}
	for _, src := range []string{"/", "/etc", "/usr/bin", "/root", native.StateDirOf(b)} {
		_, err := b.Create(t.Context(), isolation.Spec{RootFS: rootfs, Binds: []isolation.Bind{{HostPath: src, Path: "/w"}}})
		if !errors.Is(err, isolation.ErrBindRefused) {
			t.Errorf("Create with a writable bind of %s: %v, want ErrBindRefused", src, err)
		}
	}
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(dir, link)
	if _, err := b.Create(t.Context(), isolation.Spec{RootFS: rootfs, Binds: []isolation.Bind{{HostPath: link, Path: "/w"}}}); err == nil {
		t.Errorf("Create with a symlink as bind source succeeded, want refusal")
	}
}

func TestCrashCleanup(t *testing.T) { forStores(t, testCrashCleanup) }

func testCrashCleanup(t *testing.T, opts native.Options) {
	b := newBackendWith(t, opts)
	rootfs := testutil.RootFS(t, "minimal")
	sb, err := b.Create(t.Context(), isolation.Spec{ID: "crashleft", RootFS: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	_ = sb // dropped without Kill, as a crashed daemon would
	// A second backend on the same state plays the restarted daemon.
	ids, err := b.Cleanup(t.Context())
	if err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	_ = ids // the sandbox is live in b, so b keeps it
	b.Forget("crashleft")
	ids, err = b.Cleanup(t.Context())
	if err != nil || len(ids) != 1 || ids[0] != "crashleft" {
		t.Fatalf("Cleanup = %v, %v; want [crashleft]", ids, err)
	}
	select {
	case <-sb.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("sandbox still running after Cleanup")
	}
	if _, err := sb.DialAgent(t.Context()); err == nil {
		t.Error("agent still reachable after Cleanup")
	}
	if !errors.Is(sb.Kill(t.Context()), nil) {
		t.Log("Kill after Cleanup reported an error (acceptable)")
	}
	// Its writable layer went too (the btrfs store: its subvolume).
	if opts.LayerFS != "" {
		if _, err := os.Stat(filepath.Join(opts.LayerFS, "sandboxes", b.Instance(), "crashleft")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the crashed sandbox's subvolume is left after Cleanup: %v", err)
		}
	}
}

// TestCPUQuota runs two busy loops in a sandbox limited to half a core and
// checks the CPU time its cgroup was charged. The bound is from above
// (CFS cannot hand out more than the quota, plus one period of slack), so
// a slow machine cannot make it fail.
// TestIdleAgentTasks: once a command has run and ended, an idle sandbox
// holds at most four tasks of the host's (its agent's threads: the Go
// runtime's monitor and template thread, and two for its one P), so that
// thousands of idle sandboxes do not cost the host ten threads each.
func TestIdleAgentTasks(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{})
	if r := run(t, sb, "root", "/bin/true"); r.exit != 0 {
		t.Fatalf("true: %+v", r)
	}
	// The agent trims its threads once the command's end is sent. Before
	// Linux 6.15 (no exit status in pidfds) it reaps its children through
	// os/signal, whose two threads stay.
	want := int64(4)
	if !kernelAtLeast(6, 15) {
		want = 6
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := sb.Stats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if int64(st.Pids) <= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("an idle sandbox holds %d tasks, want at most %d", st.Pids, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAgentWithoutThreads: under a pids limit too small for the agent's
// threads, a sandbox whose init or agent dies for want of a thread (the
// Go runtime's pthread_create fails with EAGAIN) fails its create; one
// whose agent made its threads before the limit applied serves, and its
// commands fail to start. No sandbox is left half-alive (created but not
// answering), and the other sandboxes keep answering.
func TestAgentWithoutThreads(t *testing.T) {
	b := newBackend(t)
	other := create(t, b, isolation.Spec{})
	health := func(sb isolation.Sandbox) error {
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return sb.DialAgent(ctx) },
		}}
		resp, err := hc.Get("http://agent/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	failed := 0
	for i := range 6 {
		spec := isolation.Spec{ID: fmt.Sprintf("t%dnothreads%d", time.Now().UnixNano(), i),
			RootFS: testutil.RootFS(t, "minimal"), Limits: isolation.Limits{Pids: 1}}
		sb, err := b.Create(t.Context(), spec)
		if err != nil {
			failed++
			t.Logf("create %d under pids.max 1: %v", i, err)
			continue
		}
		if err := health(sb); err != nil {
			t.Errorf("create %d under pids.max 1 succeeded, but its agent does not answer: %v", i, err)
		}
		if err := sb.Kill(context.Background()); err != nil {
			t.Errorf("Kill: %v", err)
		}
	}
	t.Logf("%d of 6 creates failed", failed)
	if err := health(other); err != nil {
		t.Errorf("another sandbox stopped answering: %v", err)
	}
	if r := run(t, other, "root", "/bin/echo", "alive"); strings.TrimSpace(r.stdout) != "alive" {
		t.Errorf("another sandbox: %+v", r)
	}
}

func TestCPUQuota(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{Limits: isolation.Limits{CPUs: 0.5}})
	before, err := sb.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	run(t, sb, "root", "/bin/sh", "-c", "timeout 2 sh -c 'while :; do :; done' & timeout 2 sh -c 'while :; do :; done'; wait")
	wall := time.Since(start)
	after, err := sb.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	used := after.CPUUsage - before.CPUUsage
	if limit := wall/2 + 200*time.Millisecond; used > limit {
		t.Errorf("two busy loops under a 0.5-CPU quota used %v of CPU in %v, want ≤ %v", used, wall, limit)
	}
	if used < 100*time.Millisecond {
		t.Errorf("busy loops used only %v of CPU: the test did not load the sandbox", used)
	}
}

// TestSudo checks fence's sudo (no_new_privs rules out a setuid one): the
// base template's `user` may use it, as on E2B; nobody may not; the
// command runs as root with no_new_privs and the seccomp filter still on.
func TestSudo(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{RootFS: testutil.RootFS(t, "base")})
	r := run(t, sb, "user", "/bin/bash", "-c", "sudo id -un; sudo grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status; sudo sh -c 'exit 3'; echo rc=$?")
	want := "root\nNoNewPrivs:\t1\nSeccomp:\t2\nrc=3\n"
	if r.stdout != want {
		t.Errorf("sudo as user: stdout %q, stderr %q; want %q", r.stdout, r.stderr, want)
	}
	r = runIn(t, sb, "nobody", "/tmp", "/bin/sh", "-c", "sudo id -un; echo rc=$?")
	if !strings.Contains(r.stdout, "rc=1") || !strings.Contains(r.stderr, "not in the sudoers file") {
		t.Errorf("sudo as nobody: stdout %q, stderr %q; want a refusal", r.stdout, r.stderr)
	}
}

// TestAgentSurvivesPidsExhaustion: with every task of the sandbox's pids
// budget taken by its workload, requests that make the agent busy (several
// streams at once) must not need a thread the runtime cannot make: the
// agent stays up and answers once the workload is gone.
func TestAgentSurvivesPidsExhaustion(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{Limits: isolation.Limits{Pids: 48}})
	// Fill the budget and keep it full for a while.
	go run(t, sb, "root", "/bin/sh", "-c", "i=0; while [ $i -lt 200 ]; do sleep 4 & i=$((i+1)); done; wait")
	time.Sleep(500 * time.Millisecond)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return sb.DialAgent(ctx) },
			}}
			if resp, err := hc.Get("http://agent/health"); err == nil {
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	select {
	case <-sb.Done():
		t.Fatal("the sandbox died while its workload held every task")
	case <-time.After(5 * time.Second):
	}
	if r := run(t, sb, "root", "/bin/echo", "alive"); strings.TrimSpace(r.stdout) != "alive" {
		t.Errorf("after the workload: %+v", r)
	}
}

// kernelAtLeast reports whether the running kernel is at least major.minor.
func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// The mount points of a sandbox's template, layers and root are its init's,
// on a tmpfs in its own mount namespace: nothing is made for them on the
// host's disk, the host's scratch directory stays empty, and the sandbox's
// mounts name none of it.
func TestMountPointsAreTheInits(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{})
	for _, d := range []string{"lower", "root"} {
		if _, err := os.Lstat(filepath.Join(native.SandboxDir(sb), d)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s in the sandbox's state directory on the host: %v", d, err)
		}
	}
	if ents, err := os.ReadDir(b.ScratchDir()); err != nil || len(ents) != 0 {
		t.Errorf("the host's scratch directory: %v, %v; want it empty", ents, err)
	}
	r := run(t, sb, "root", "cat", "/proc/self/mountinfo")
	if r.exit != 0 {
		t.Fatalf("cat mountinfo: %+v", r)
	}
	if strings.Contains(r.stdout, b.ScratchDir()) || strings.Contains(r.stdout, "/scratch") {
		t.Errorf("the sandbox's mounts name the scratch directory:\n%s", r.stdout)
	}
	if r := run(t, sb, "root", "/bin/true"); r.exit != 0 {
		t.Fatalf("exec: %+v", r)
	}
}
