package gvisor_test

// Attacks from inside real gVisor sandboxes: the probes `fence selftest`
// runs (network, filesystem, devices, limits, syscalls), and the limits
// and template protections the native backend's tests attack too.

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/gvisor"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/selftest"
	"github.com/fencesandbox/fence/internal/selftest/probe"
	"github.com/fencesandbox/fence/internal/testutil"
)

type flowRecorder struct{ log *selftest.FlowLog }

func (r flowRecorder) Record(_ context.Context, ev egress.FlowEvent) {
	r.log.Record(selftest.Flow{Proto: ev.Proto, Dst: ev.Dst, Name: ev.Name, Allowed: ev.Allowed, Reason: ev.Reason})
}

func newBackendWith(t *testing.T, opts gvisor.Options) *gvisor.Backend {
	t.Helper()
	opts.StateDir = filepath.Join(testutil.StateDir(t), "state")
	opts.Instance = "atk" + strings.ToLower(strings.NewReplacer("/", "", "_", "").Replace(t.Name()))
	opts.Runsc = testutil.RequireRunsc(t)
	opts.Executable = testutil.FenceBinary(t)
	if opts.Network == nil {
		opts.Network = isolationtest.Network(nil)
	}
	b, err := gvisor.New(t.Context(), opts)
	if err != nil {
		t.Fatalf("gvisor.New: %v", err)
	}
	t.Cleanup(func() {
		if _, err := b.Cleanup(context.Background()); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
		b.Close()
	})
	return b
}

func createIn(t *testing.T, b isolation.Backend, spec isolation.Spec) isolation.Sandbox {
	t.Helper()
	if spec.RootFS == "" {
		spec.RootFS = testutil.RootFS(t, "minimal")
	}
	s, err := b.Create(t.Context(), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { s.Kill(context.Background()) })
	return s
}

func sh(t *testing.T, s isolation.Sandbox, script string) (string, int32) {
	t.Helper()
	out, code, err := isolationtest.Exec(t.Context(), s, "/bin/sh", "-c", script)
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return out, code
}

// TestAttacks runs every probe of package probe from inside a gvisor
// sandbox as its root, as `fence selftest` does; the network checks also
// require the refusal on the daemon's stack's record.
func TestAttacks(t *testing.T) {
	flows := selftest.NewFlowLog()
	b := newBackendWith(t, gvisor.Options{Network: isolationtest.Network(flowRecorder{flows})})
	limits := isolation.Limits{MemoryBytes: 256 << 20, Pids: 128}
	s := createIn(t, b, isolation.Spec{Limits: limits})
	exec, closeExec := selftest.AgentExec(s.DialAgent)
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
			if why, ok := notOnGvisor[r.Name]; ok {
				t.Logf("not applicable on gvisor (%s): %v", why, r)
				return
			}
			if !r.Pass {
				t.Error(r)
			}
		})
	}
}

// notOnGvisor are the probes whose check is about the host kernel's own
// mechanisms that a native sandbox rests on (its seccomp filter, its uid
// mapping, its /proc and /dev); in a gvisor sandbox the syscall, file or
// device they try is served by gVisor's kernel, not the host's. The limits
// are attacked by their own tests below.
var notOnGvisor = map[string]string{
	"uid":          "sandbox ids are gVisor's, the sentry runs as an unprivileged host user",
	"seccomp":      "no filter inside: every syscall goes to gVisor; runsc filters the sentry",
	"userns":       "gVisor's own user namespaces",
	"tiocsti":      "gVisor's own terminals",
	"msg-oob":      "gVisor's own socket implementation",
	"setid":        "gVisor's own credentials",
	"x32":          "gVisor serves one ABI",
	"sockets":      "gVisor's own socket families",
	"proc-sys-ro":  "gVisor's own /proc/sys",
	"sysrq":        "gVisor's own /proc",
	"devices":      "gVisor's own /dev",
	"pids-limit":   "bounded by RLIMIT_NPROC in gVisor: TestPidsLimitHoldsForkBomb",
	"memory-limit": "the host cgroup bounds the whole sandbox (sentry included): TestMemoryLimitEndsSandbox",
}

func TestTemplateUnwritable(t *testing.T) {
	b := newBackendWith(t, gvisor.Options{})
	rootfs := testutil.RootFS(t, "minimal")
	before, err := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	a := createIn(t, b, isolation.Spec{})
	if out, _ := sh(t, a, "echo pwned >> /etc/passwd && rm -f /bin/ls && touch /newfile && echo done"); !strings.Contains(out, "done") {
		t.Fatalf("writes inside the sandbox's own layer failed: %q", out)
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
	other := createIn(t, b, isolation.Spec{})
	if out, _ := sh(t, other, "grep -c pwned /etc/passwd; ls /bin/ls"); strings.HasPrefix(out, "1") || !strings.Contains(out, "/bin/ls") {
		t.Errorf("another sandbox sees the first one's changes: %q", out)
	}
}

func TestPidsLimitHoldsForkBomb(t *testing.T) {
	b := newBackendWith(t, gvisor.Options{})
	s := createIn(t, b, isolation.Spec{Limits: isolation.Limits{Pids: 64}})
	out, _ := sh(t, s, "i=0; while [ $i -lt 120 ]; do sleep 20 </dev/null >/dev/null 2>&1 & i=$((i+1)); done 2>&1 | tail -1; echo looped; ps | wc -l")
	t.Logf("fork loop under pids=64: %q", out)
	lines := strings.Fields(out)
	if n, err := strconv.Atoi(lines[len(lines)-1]); err != nil || n > 70 {
		t.Errorf("%s processes listed after a 120-fork loop under a pids limit of 64", lines[len(lines)-1])
	}
	if out, _ := sh(t, s, "echo alive"); strings.TrimSpace(out) != "alive" {
		t.Errorf("after the fork loop: %q", out)
	}
}

func TestDiskLimit(t *testing.T) {
	b := newBackendWith(t, gvisor.Options{})
	s := createIn(t, b, isolation.Spec{Limits: isolation.Limits{DiskBytes: 16 << 20}})
	out, _ := sh(t, s, "dd if=/dev/zero of=/big bs=1M count=64 2>&1; echo rc=$?")
	if !strings.Contains(out, "rc=1") || !strings.Contains(out, "space") {
		t.Errorf("64 MiB write under a 16 MiB disk limit: %q", out)
	}
}

func TestProcessesInvisible(t *testing.T) {
	b := newBackendWith(t, gvisor.Options{})
	a := createIn(t, b, isolation.Spec{})
	sh(t, a, "(sleep 300 </dev/null >/dev/null 2>&1 &); echo started")
	other := createIn(t, b, isolation.Spec{})
	if out, _ := sh(t, other, "ps -o comm | grep -c 'sleep' || true"); strings.TrimSpace(out) != "0" {
		t.Errorf("a sandbox sees another's processes: %q", out)
	}
	if out, _ := sh(t, a, "ps -o pid,comm | head -3"); !strings.Contains(out, "1 ") {
		t.Errorf("ps in the sandbox: %q", out)
	}
}

// TestMemoryLimitEndsSandbox: on gvisor the memory limit is the host
// cgroup's, over the whole sandbox (gVisor's kernel and its memory file
// included), so a workload that takes more than the limit (the probe's
// balloon) never gets it: the host's OOM killer ends the sandbox (Done
// closes) or the balloon dies, and the group's usage stays under the limit.
func TestMemoryLimitEndsSandbox(t *testing.T) {
	b := newBackendWith(t, gvisor.Options{})
	s := createIn(t, b, isolation.Spec{Limits: isolation.Limits{MemoryBytes: 128 << 20}})
	argv := append(append([]string(nil), selftest.ProbeCommand...), "memory-limit", strconv.Itoa(128<<20))
	out, code, err := isolationtest.Exec(t.Context(), s, argv...)
	t.Logf("balloon: exit %d, %v, %q", code, err, out)
	if err == nil && code == 0 {
		t.Errorf("a balloon past the 128 MiB limit completed")
	}
	select {
	case <-s.Done():
		t.Logf("the sandbox ended: its memory limit covers gVisor's kernel too")
	case <-time.After(5 * time.Second):
		st, err := s.Stats(t.Context())
		if err != nil || st.MemoryBytes > 128<<20 {
			t.Errorf("sandbox memory %d (%v) above its 128 MiB limit", st.MemoryBytes, err)
		}
	}
}

// driveAgent is run inside the sandbox by python3: it asks the agent's
// port on every address given to start `touch /tmp/agent-pwned` as root
// (a Connect call, as an envd client makes it), first from a socket bound
// to the daemon's end of the network (10.0.2.2, with IP_FREEBIND and
// IP_TRANSPARENT tried first), then plainly. It prints one line per try:
// ANSWERED when an HTTP answer came back.
const driveAgent = `
import json, socket, struct, sys
msg = json.dumps({"process": {"cmd": "/bin/touch", "args": ["/tmp/agent-pwned"]}}).encode()
body = b"\0" + struct.pack(">I", len(msg)) + msg
req = (b"POST /process.Process/Start HTTP/1.1\r\nHost: agent\r\nContent-Type: application/connect+json\r\n"
       b"Connect-Protocol-Version: 1\r\nAuthorization: Basic cm9vdDo=\r\nContent-Length: %d\r\n"
       b"Connection: close\r\n\r\n" % len(body)) + body
def attempt(host, src):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        if src:
            for opt in (15, 19):  # IP_FREEBIND, IP_TRANSPARENT
                try:
                    s.setsockopt(socket.SOL_IP, opt, 1)
                except OSError:
                    pass
            s.bind((src, 0))
        s.connect((host, 49983))
        s.sendall(req)
        got = s.recv(64)
        print(("ANSWERED" if got.startswith(b"HTTP/") else "refused"), host, "from", src or "-", got[:40])
    except OSError as e:
        print("refused", host, "from", src or "-", e)
    finally:
        s.close()
for host in sys.argv[1:]:
    if ":" not in host:
        attempt(host, "10.0.2.2")
    attempt(host, None)
`

// TestAgentRefusesSandboxProcesses: no process of the sandbox, neither its
// unprivileged user nor its root, can drive the agent (which would run a
// command as root past the template's sudo rules) on loopback or the
// sandbox's own addresses, also not from a socket bound to the daemon's
// end of the network; the daemon's own requests still go through.
func TestAgentRefusesSandboxProcesses(t *testing.T) {
	b := newBackendWith(t, gvisor.Options{})
	s := createIn(t, b, isolation.Spec{RootFS: testutil.RootFS(t, "base")})
	// The template's sudo rules: `user` may not become root.
	sh(t, s, `rm -f /etc/sudoers.d/user && sed -i -E 's/^(sudo:[^:]*:[^:]*:).*/\1/' /etc/group`)
	if out, code, err := isolationtest.ExecAs(t.Context(), s, "user", "sudo", "-n", "true"); err != nil || code == 0 {
		t.Fatalf("sudo as user after its rules were removed: exit %d, %v, %q; want refused", code, err, out)
	}
	addrs := []string{"127.0.0.1", "::1", egress.SandboxIPv4.Addr().String(), egress.SandboxIPv6.Addr().String()}
	for _, user := range []string{"user", "root"} {
		out, code, err := isolationtest.ExecAs(t.Context(), s, user, append([]string{"python3", "-c", driveAgent}, addrs...)...)
		if err != nil || code != 0 {
			t.Fatalf("driving the agent as %s: exit %d, %v, %q", user, code, err, out)
		}
		t.Logf("as %s:\n%s", user, out)
		if strings.Contains(out, "ANSWERED") {
			t.Errorf("as %s, a process of the sandbox got an answer from the agent:\n%s", user, out)
		}
		argv := append(append([]string(nil), selftest.ProbeCommand...), "agent-reach")
		if out, code, err := isolationtest.ExecAs(t.Context(), s, user, argv...); err != nil || code != probe.ExitRefused {
			t.Errorf("probe agent-reach as %s: exit %d, %v, %q", user, code, err, out)
		}
	}
	if out, _ := sh(t, s, "ls -l /tmp/agent-pwned 2>&1 || echo absent"); !strings.Contains(out, "absent") {
		t.Errorf("a process of the sandbox started a command through the agent: %q", out)
	}
	if out, _ := sh(t, s, "id -u"); strings.TrimSpace(out) != "0" {
		t.Errorf("the daemon's exec as root after the attempts: %q", out)
	}
}

// TestSudoFollowsTemplateRules: fence's sudo grants what the template's
// rules grant, per the caller's own credentials: the base template's
// `user` may sudo while its /etc/sudoers.d file is there, and not once it
// is gone; root always may.
func TestSudoFollowsTemplateRules(t *testing.T) {
	b := newBackendWith(t, gvisor.Options{})
	s := createIn(t, b, isolation.Spec{RootFS: testutil.RootFS(t, "base")})
	sudo := func(user string) (string, int32) {
		out, code, err := isolationtest.ExecAs(t.Context(), s, user, "sh", "-c", "sudo -n sh -c 'id -u; echo $SUDO_USER'")
		if err != nil {
			t.Fatalf("sudo as %s: %v", user, err)
		}
		return out, code
	}
	if out, code := sudo("user"); code != 0 || out != "0\nuser\n" {
		t.Errorf("sudo as user with its sudoers.d file: exit %d, %q; want root, called by user", code, out)
	}
	sh(t, s, `rm /etc/sudoers.d/user && sed -i -E 's/^(sudo:[^:]*:[^:]*:).*/\1/' /etc/group`)
	if out, code := sudo("user"); code == 0 || !strings.Contains(out, "not in the sudoers file") {
		t.Errorf("sudo as user without sudo rules: exit %d, %q; want refused", code, out)
	}
	if out, code := sudo("root"); code != 0 || out != "0\nroot\n" {
		t.Errorf("sudo as root: exit %d, %q", code, out)
	}
}
