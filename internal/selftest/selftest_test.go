package selftest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/selftest/probe"
)

// fakeSandbox plays a sandbox that refuses every attack: the probe says
// "ok", or dies by the expected signal. override replaces the outcome of
// chosen checks; onRun sees each argv (after the outcome is chosen).
type fakeSandbox struct {
	override map[string]func(argv []string) (Outcome, error)
	onRun    func(argv []string)
	argvs    [][]string
}

func (f *fakeSandbox) exec(_ context.Context, argv []string) (Outcome, error) {
	f.argvs = append(f.argvs, argv)
	if f.onRun != nil {
		f.onRun(argv)
	}
	name := argv[len(ProbeCommand)]
	if o, ok := f.override[name]; ok {
		return o(argv)
	}
	c, _ := probe.Lookup(name)
	if c.KilledBy != 0 {
		return Outcome{ExitCode: -1, Signal: c.KilledBy}, nil
	}
	return Outcome{Stdout: "ok\n"}, nil
}

func run(t *testing.T, f *fakeSandbox, opts Options) Report {
	t.Helper()
	opts.Exec = f.exec
	if opts.MemoryBytes == 0 {
		opts.MemoryBytes, opts.Pids = 512<<20, 1024
	}
	if opts.HostAddrs == nil {
		opts.HostAddrs = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	}
	rep, err := Run(t.Context(), opts)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rep
}

func text(t *testing.T, rep Report) string {
	t.Helper()
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestAllRefused(t *testing.T) {
	f := &fakeSandbox{}
	var streamed []Result
	rep := run(t, f, Options{OnResult: func(r Result) { streamed = append(streamed, r) }})
	n := len(probe.Checks())
	if !rep.OK() || rep.Passed != n || rep.Failed != 0 || len(rep.Results) != n || len(streamed) != n {
		t.Fatalf("report = %+v (streamed %d), want %d passes", rep, len(streamed), n)
	}
	lines := strings.Split(strings.TrimSuffix(text(t, rep), "\n"), "\n")
	for i, c := range probe.Checks() {
		if want := "PASS " + c.Name + " — " + c.Proves; !strings.HasPrefix(lines[i], want) {
			t.Errorf("line %d = %q, want it to start with %q", i, lines[i], want)
		}
	}
	if last := lines[len(lines)-1]; last != strconv.Itoa(n)+" passed, 0 failed" {
		t.Errorf("summary = %q", last)
	}
	// The probes got the arguments their checks need.
	want := map[string]string{
		"pids-limit": "1024", "memory-limit": "536870912",
	}
	for _, argv := range f.argvs {
		if !slices.Equal(argv[:len(ProbeCommand)], ProbeCommand) {
			t.Errorf("argv %q does not start with %q", argv, ProbeCommand)
		}
		name, args := argv[len(ProbeCommand)], argv[len(ProbeCommand)+1:]
		if w, ok := want[name]; ok && (len(args) != 1 || args[0] != w) {
			t.Errorf("%s got args %q, want [%s]", name, args, w)
		}
		if (name == "egress" || name == "egress-host" || name == "dns") && len(args) == 0 {
			t.Errorf("%s got no targets", name)
		}
	}
}

// TestFailureReported injects one escape: the report must say FAIL for it,
// with the probe's words, count it, and not be OK.
func TestFailureReported(t *testing.T) {
	f := &fakeSandbox{override: map[string]func([]string) (Outcome, error){
		"seccomp": func([]string) (Outcome, error) {
			return Outcome{Stdout: "ESCAPE: Seccomp is 0, want 2\n", ExitCode: probe.ExitEscaped}, nil
		},
	}}
	rep := run(t, f, Options{})
	if rep.OK() || rep.Failed != 1 || rep.Passed != len(probe.Checks())-1 {
		t.Fatalf("report = %d passed, %d failed, OK %v; want exactly one failure", rep.Passed, rep.Failed, rep.OK())
	}
	out := text(t, rep)
	if !strings.Contains(out, "\nFAIL seccomp — ESCAPE: Seccomp is 0, want 2\n") {
		t.Errorf("text report lacks the failure line:\n%s", out)
	}
	if !strings.HasSuffix(out, "\n"+strconv.Itoa(len(probe.Checks())-1)+" passed, 1 failed\n") {
		t.Errorf("text report summary wrong:\n%s", out)
	}
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || back.Failed != 1 || len(back.Results) != len(rep.Results) {
		t.Errorf("JSON report %s: %v", b.String(), err)
	}
	if (Report{}).OK() {
		t.Error("an empty report is OK; want not OK (nothing was checked)")
	}
}

func TestJudge(t *testing.T) {
	plain, _ := probe.Lookup("caps")
	x32, _ := probe.Lookup("x32")
	tests := []struct {
		name string
		c    probe.Check
		out  Outcome
		err  error
		pass bool
		says string
	}{
		{"ok", plain, Outcome{Stdout: "ok\n"}, nil, true, plain.Proves},
		{"escape", plain, Outcome{Stdout: "ESCAPE: CapBnd holds CAP_SYS_ADMIN\n", ExitCode: 1}, nil, false, "ESCAPE: CapBnd holds CAP_SYS_ADMIN"},
		{"probe error", plain, Outcome{Stdout: "ERROR: no CapBnd\n", ExitCode: 3}, nil, false, "ERROR: no CapBnd"},
		{"ok but nonzero exit", plain, Outcome{Stdout: "ok\n", ExitCode: 1}, nil, false, "exited 1"},
		{"exit 0 without ok", plain, Outcome{Stdout: "hello\n"}, nil, false, `stdout "hello"`},
		{"killed", plain, Outcome{Signal: syscall.SIGKILL, ExitCode: -1}, nil, false, "was killed by killed"},
		{"not run", plain, Outcome{}, errors.New("no such file"), false, "did not run to its end: no such file"},
		{"x32 killed by SIGSYS", x32, Outcome{Signal: syscall.SIGSYS}, nil, true, "killed by bad system call"},
		{"x32 returned", x32, Outcome{Stdout: "ESCAPE: x32 syscall returned\n", ExitCode: 1}, nil, false, "ESCAPE: x32 syscall returned"},
		{"x32 wrong signal", x32, Outcome{Signal: syscall.SIGSEGV}, nil, false, "want it killed by bad system call"},
		{"x32 exit 0", x32, Outcome{Stdout: "ok\n"}, nil, false, "exited 0"},
	}
	for _, tt := range tests {
		r := Judge(tt.c, tt.out, tt.err)
		if r.Pass != tt.pass || !strings.Contains(r.Detail, tt.says) || r.Name != tt.c.Name {
			t.Errorf("%s: Judge = %+v; want pass %v and a detail with %q", tt.name, r, tt.pass, tt.says)
		}
	}
}

func result(rep Report, name string) Result {
	for _, r := range rep.Results {
		if r.Name == name {
			return r
		}
	}
	return Result{}
}

// TestNetworkEvidence checks that a refusal seen only inside the sandbox
// is not enough when the stack's record is available: the flow must be on
// record, and refused by policy.
func TestNetworkEvidence(t *testing.T) {
	flowWait = 200 * time.Millisecond
	t.Cleanup(func() { flowWait = 3 * time.Second })
	tests := []struct {
		name   string
		record func(l *FlowLog, argv []string)
		pass   bool
		says   string
	}{
		{"refused by policy", func(l *FlowLog, argv []string) {
			for _, a := range argv[len(ProbeCommand)+1:] {
				l.Record(Flow{Proto: "tcp", Dst: netip.MustParseAddrPort(a), Reason: "default-deny"})
			}
		}, true, "refused by fence: default-deny"},
		{"not on record", func(*FlowLog, []string) {}, false, "recorded no decision"},
		{"allowed", func(l *FlowLog, argv []string) {
			for _, a := range argv[len(ProbeCommand)+1:] {
				l.Record(Flow{Proto: "tcp", Dst: netip.MustParseAddrPort(a), Allowed: true, Reason: "allowed"})
			}
		}, false, "let the flow"},
		{"dial failed", func(l *FlowLog, argv []string) {
			for _, a := range argv[len(ProbeCommand)+1:] {
				l.Record(Flow{Proto: "tcp", Dst: netip.MustParseAddrPort(a), Reason: "dial-failed"})
			}
		}, false, `reason "dial-failed"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flows := NewFlowLog()
			f := &fakeSandbox{onRun: func(argv []string) {
				switch argv[len(ProbeCommand)] {
				case "egress", "egress-host":
					tt.record(flows, argv)
				case "dns":
					flows.Record(Flow{Proto: "dns", Name: argv[len(ProbeCommand)+1], Reason: "name-not-allowed"})
				}
			}}
			rep := run(t, f, Options{Flows: flows})
			for _, name := range []string{"egress", "egress-host"} {
				r := result(rep, name)
				if r.Pass != tt.pass || !strings.Contains(r.Detail, tt.says) {
					t.Errorf("%s: %v; want pass %v and %q", name, r, tt.pass, tt.says)
				}
			}
			if r := result(rep, "dns"); !r.Pass || !strings.Contains(r.Detail, "name-not-allowed") {
				t.Errorf("dns: %v", r)
			}
		})
	}
	t.Run("dns allowed", func(t *testing.T) {
		flows := NewFlowLog()
		f := &fakeSandbox{onRun: func(argv []string) {
			if argv[len(ProbeCommand)] == "dns" {
				flows.Record(Flow{Proto: "dns", Name: strings.ToUpper(argv[len(ProbeCommand)+1]), Allowed: true, Reason: "allowed"})
			}
		}}
		if r := result(run(t, f, Options{Flows: flows}), "dns"); r.Pass || !strings.Contains(r.Detail, "resolver allowed") {
			t.Errorf("dns answered by the resolver: %v; want FAIL", r)
		}
	})
}

// TestHostListener plays a sandbox whose "refused" connection to the host
// actually arrived: the listener's count must turn it into a failure.
func TestHostListener(t *testing.T) {
	f := &fakeSandbox{onRun: func(argv []string) {
		if argv[len(ProbeCommand)] != "egress-host" {
			return
		}
		for _, a := range argv[len(ProbeCommand)+1:] {
			if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
				c.Close()
			}
		}
	}}
	rep := run(t, f, Options{})
	r := result(rep, "egress-host")
	if r.Pass || !strings.Contains(r.Detail, "accepted") {
		t.Errorf("egress-host with a connection that reached the host: %v; want FAIL", r)
	}
	if rep.OK() {
		t.Error("report OK despite the failure")
	}
}

func TestInterfaceAddrs(t *testing.T) {
	for _, a := range interfaceAddrs() {
		if a.IsLoopback() || (a.Is6() && a.IsLinkLocalUnicast()) || a.Is4In6() {
			t.Errorf("interfaceAddrs holds %v", a)
		}
	}
}
