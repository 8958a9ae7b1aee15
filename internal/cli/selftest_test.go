package cli

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/client/clienttest"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/selftest"
	"github.com/fencesandbox/fence/internal/selftest/probe"
	"github.com/fencesandbox/fence/internal/testutil"
)

func TestSelftestHelp(t *testing.T) {
	code, out, _ := execute(t, Deps{}, "", "selftest", "--help")
	if code != 0 {
		t.Fatalf("fence selftest --help = %d", code)
	}
	for _, c := range probe.Checks() {
		if !strings.Contains(out, "    "+c.Name+" — ") {
			t.Errorf("fence selftest --help does not describe check %s:\n%s", c.Name, out)
		}
	}
	for _, want := range []string{"What a FAIL means", "Exit status", "--json", "--template"} {
		if !strings.Contains(out, want) {
			t.Errorf("fence selftest --help lacks %q", want)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if n := len([]rune(line)); n > 80 && strings.HasPrefix(line, "    ") && !strings.HasPrefix(line, "      --") {
			t.Errorf("help line of %d columns: %q", n, line)
		}
	}
}

func TestSelftestSetupErrors(t *testing.T) {
	code, _, stderr := execute(t, Deps{NewLocal: failNewLocal}, "", "selftest", "--data-dir", t.TempDir())
	if code != 2 || !strings.HasPrefix(stderr, "fence: selftest: ") {
		t.Errorf("fence selftest with a failing backend = %d, %q; want 2 and a message", code, stderr)
	}
	if os.Geteuid() == 0 && !strings.Contains(stderr, "no sandbox in this test") {
		t.Errorf("as root, stderr %q does not say why the sandbox did not start", stderr)
	}
	if os.Geteuid() != 0 && !strings.Contains(stderr, "must run as root") {
		t.Errorf("not root, stderr %q does not say root is needed", stderr)
	}
	if code, _, stderr := execute(t, Deps{}, "", "selftest"); code != 1 || !strings.Contains(stderr, "not available") {
		t.Errorf("fence selftest without NewLocal = %d, %q", code, stderr)
	}
}

// TestSelftestFailsOnAnAgentThatRunsNothing runs the selftest against a
// fake agent that cannot start the probe: every check must FAIL, and the
// exit status must be 1.
func TestSelftestFailsOnAnAgentThatRunsNothing(t *testing.T) {
	testutil.RequireRoot(t) // fence selftest refuses to start without root
	n := len(probe.Checks())
	for _, asJSON := range []bool{false, true} {
		srv := httptest.NewServer(clienttest.NewAgent())
		sb := &localSandbox{addr: srv.Listener.Addr().String(), done: make(chan struct{})}
		var opts LocalOptions
		deps := Deps{NewLocal: func(ctx context.Context, o LocalOptions) (isolation.Sandbox, error) {
			opts = o
			return sb, nil
		}}
		args := []string{"selftest", "--template", "base", "--data-dir", t.TempDir()}
		if asJSON {
			args = append(args, "--json")
		}
		code, out, stderr := execute(t, deps, "", args...)
		srv.Close()
		if code != 1 {
			t.Errorf("fence %v = %d (stderr %q), want 1", args, code, stderr)
		}
		if sb.kills != 1 {
			t.Errorf("fence %v killed the sandbox %d times, want 1", args, sb.kills)
		}
		if opts.Template != "base" || opts.Limits != defaultLimits() || opts.OnFlow == nil {
			t.Errorf("fence %v local options = %+v; want template base, the default limits and a flow observer", args, opts)
		}
		if asJSON {
			var rep selftest.Report
			if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Failed != n || rep.Passed != 0 || len(rep.Results) != n {
				t.Errorf("fence %v printed %q (%v), want a report of %d failures", args, out, err, n)
			}
			continue
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(lines) != n+1 || lines[n] != "0 passed, "+strconv.Itoa(n)+" failed" {
			t.Fatalf("fence %v printed:\n%s\nwant %d FAIL lines and a summary", args, out, n)
		}
		for i, c := range probe.Checks() {
			if !strings.HasPrefix(lines[i], "FAIL "+c.Name+" — the probe did not run to its end") {
				t.Errorf("line %d = %q, want FAIL %s", i, lines[i], c.Name)
			}
		}
	}
}

func TestReportSelftestExitStatus(t *testing.T) {
	pass := selftest.Report{Results: []selftest.Result{{Name: "a", Pass: true}}, Passed: 1}
	failed := selftest.Report{Results: []selftest.Result{{Name: "a", Pass: true}, {Name: "b"}}, Passed: 1, Failed: 1}
	for _, tt := range []struct {
		rep  selftest.Report
		code int
	}{{pass, 0}, {failed, 1}, {selftest.Report{}, 1}} {
		cmd := selftestCmd(Deps{})
		var out strings.Builder
		cmd.SetOut(&out)
		err := reportSelftest(cmd, tt.rep, false)
		code := 0
		if ee, ok := err.(*ExitError); ok {
			code = ee.Code
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tt.code || out.String() != tt.rep.Summary()+"\n" {
			t.Errorf("report %+v: exit %d, printed %q; want %d and the summary", tt.rep, code, out.String(), tt.code)
		}
	}
}
