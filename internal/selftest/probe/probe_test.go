package probe

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/testutil"
)

// childEnv makes the test binary run probe.Main on its arguments instead
// of the tests, so a check runs in a process of its own, as in a sandbox.
const childEnv = "FENCE_PROBE_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(Main(os.Args[1:], os.Stdout))
	}
	os.Exit(m.Run())
}

// runChild runs check in a new process and returns its verdict line and
// exit code.
func runChild(t *testing.T, extra []*os.File, args ...string) (string, int) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.ExtraFiles = extra
	var out bytes.Buffer
	cmd.Stdout = &out
	err = cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running probe %q: %v", args, err)
	}
	return strings.TrimSpace(out.String()), code
}

func TestProtocol(t *testing.T) {
	if out, code := runChild(t, nil); code != ExitUsage || !strings.Contains(out, "usage") {
		t.Errorf("no check: exit %d, %q; want %d and usage", code, out, ExitUsage)
	}
	if out, code := runChild(t, nil, "nosuch"); code != ExitUsage || !strings.Contains(out, "unknown check") {
		t.Errorf("unknown check: exit %d, %q; want %d", code, out, ExitUsage)
	}
	if out, code := runChild(t, nil, "pids-limit", "lots"); code != ExitUsage {
		t.Errorf("pids-limit lots: exit %d, %q; want %d", code, out, ExitUsage)
	}
	if out, code := runChild(t, nil, "egress"); code != ExitUsage {
		t.Errorf("egress without targets: exit %d, %q; want %d", code, out, ExitUsage)
	}
	if out, code := runChild(t, nil, "inet"); code != ExitRefused || out != "ok" {
		t.Errorf("inet: exit %d, %q; want ok", code, out)
	}
	seen := map[string]bool{}
	for _, c := range Checks() {
		if seen[c.Name] || c.Proves == "" || c.Group == "" || c.run == nil {
			t.Errorf("check %+v: duplicate, or without Proves, Group or code", c)
		}
		seen[c.Name] = true
	}
}

// TestFDsSeesInheritedDescriptors hands the probe a descriptor the way a
// leaky parent would (not close-on-exec) and expects it reported.
func TestFDsSeesInheritedDescriptors(t *testing.T) {
	// Whatever this test process inherited itself stays here.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if out, code := runChild(t, nil, "fds"); code != ExitRefused {
		t.Fatalf("fds with stdio only: exit %d, %q; want ok", code, out)
	}
	f, err := os.Open(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out, code := runChild(t, []*os.File{f}, "fds")
	if code != ExitEscaped || !strings.Contains(out, "3->"+os.TempDir()) {
		t.Errorf("fds with an inherited directory as fd 3: exit %d, %q; want an ESCAPE naming it", code, out)
	}
}

// TestChecksCatchTheHost runs the checks on the host, outside any
// sandbox, where every attack they try works: each must report ESCAPE, so
// none of them passes whatever happens. It needs root (host root's
// privileges are what the checks look for). Checks whose attack would
// disturb the host are left out: ptrace-init (it would stop the host's
// init), mount and the namespace checks (they would mount on the host's
// /tmp or re-run this binary), the egress checks (they need a sandbox's
// network to prove anything), agent-proc (the host's PID 1 is not ours to
// read) and the mask checks that need a mask. A check whose target this
// kernel lacks (AF_ALG, /proc/sysrq-trigger) cannot fail here: it is
// logged.
func TestChecksCatchTheHost(t *testing.T) {
	testutil.RequireRoot(t)
	tmp := t.TempDir()
	args := map[string][]string{
		"setid":        {tmp},
		"pids-limit":   {"20"},
		"memory-limit": {strconv.Itoa(8 << 20)},
	}
	skip := map[string]bool{
		"ptrace-init": true, "agent-proc": true, "mount": true, "userns": true, "netns": true,
		"remount-proc": true, "umount-mask": true, "egress": true, "egress-host": true, "dns": true,
		"inet":        true, // a control that must pass everywhere (TestProtocol)
		"fds":         true, // TestFDsSeesInheritedDescriptors
		"agent-reach": true, // TestAgentReach (no agent listens on the host)
	}
	for _, c := range Checks() {
		if skip[c.Name] {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			if why := absent(c.Name); why != "" {
				t.Logf("%s cannot escape on this host: %s", c.Name, why)
				return
			}
			out, code := runChild(t, nil, append([]string{c.Name}, args[c.Name]...)...)
			if code != ExitEscaped || !strings.HasPrefix(out, "ESCAPE: ") {
				t.Errorf("%s on the host: exit %d, %q; want ESCAPE", c.Name, code, out)
			}
		})
	}
}

// absent says why the host lacks what check name attacks, or "".
func absent(name string) string {
	switch name {
	case "alg":
		fd, err := unix.Socket(unix.AF_ALG, unix.SOCK_SEQPACKET, 0)
		if err != nil {
			return "socket(AF_ALG): " + err.Error()
		}
		unix.Close(fd)
	case "sysrq":
		if _, err := os.Stat("/proc/sysrq-trigger"); err != nil {
			return err.Error()
		}
	}
	return ""
}

// TestAgentReach points agent-reach at a port where an HTTP server answers
// (an agent open to the sandbox), at one whose listener resets every
// connection unread (an agent that serves its supervisor alone) and at a
// closed port.
func TestAgentReach(t *testing.T) {
	var started atomic.Bool
	open := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/process.Process/Start" &&
			r.Header.Get("Content-Type") == "application/connect+json" {
			started.Store(true)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer open.Close()
	if out, code := runChild(t, nil, "agent-reach", port(t, open.Listener)); code != ExitEscaped || !strings.Contains(out, "start /bin/true") {
		t.Errorf("agent-reach at an open agent: exit %d, %q; want ESCAPE", code, out)
	}
	if !started.Load() {
		t.Error("the probe did not ask for a process the way an envd client does")
	}

	resets, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer resets.Close()
	go func() {
		for {
			c, err := resets.Accept()
			if err != nil {
				return
			}
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	}()
	if out, code := runChild(t, nil, "agent-reach", port(t, resets)); code != ExitRefused || out != "ok" {
		t.Errorf("agent-reach at a listener that resets: exit %d, %q; want ok", code, out)
	}

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := port(t, closed)
	closed.Close()
	if out, code := runChild(t, nil, "agent-reach", p); code != ExitRefused || out != "ok" {
		t.Errorf("agent-reach at a closed port: exit %d, %q; want ok", code, out)
	}
	if out, code := runChild(t, nil, "agent-reach", "0"); code != ExitUsage {
		t.Errorf("agent-reach 0: exit %d, %q; want %d", code, out, ExitUsage)
	}
}

func port(t *testing.T, ln net.Listener) string {
	t.Helper()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}
