package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TestAuditDaemon runs the audit trail in a real daemon: its files and
// modes, the API routes, a forwarded copy, and `fence audit verify` after
// a SIGKILL and after a clean stop.
func TestAuditDaemon(t *testing.T) {
	dataDir := newDataDir(t)
	fwd := filepath.Join(t.TempDir(), "forwarded.jsonl")
	d := startDaemon(t, dataDir, "--audit-forward", "file:"+fwd)
	for p, want := range map[string]os.FileMode{"audit": 0o700 | os.ModeDir, "audit-key": 0o600, "audit.pub": 0o644} {
		st, err := os.Lstat(filepath.Join(dataDir, p))
		if err != nil || st.Mode() != want {
			t.Fatalf("%s: %v %v, want mode %v", p, st.Mode(), err, want)
		}
	}
	// Not d.create: the daemon is gone at cleanup, and its crash takes
	// the sandbox with it.
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	r := d.do(t, "GET", "/v2/sandboxes/"+sb.ID()+"/logs", d.Key, nil, nil)
	var v2 api.SandboxLogsV2
	if r.Status != 200 || json.Unmarshal(r.Body, &v2) != nil || v2.Logs == nil {
		t.Fatalf("v2 logs: %d %s", r.Status, r.Body)
	}
	r = d.do(t, "GET", "/sandboxes/"+sb.ID()+"/logs?start=0", d.Key, nil, nil)
	if r.Status != 200 || !strings.Contains(string(r.Body), `"logEntries":[`) {
		t.Fatalf("v1 logs: %d %s", r.Status, r.Body)
	}
	if r = d.do(t, "GET", "/v2/sandboxes/nosuchsandbox0000000/logs", d.Key, nil, nil); r.Status != 404 {
		t.Fatalf("unknown sandbox: %d %s", r.Status, r.Body)
	}
	if r = d.do(t, "GET", "/audit?limit=10", "", nil, nil); r.Status != 401 {
		t.Fatalf("/audit without a key: %d", r.Status)
	}
	if r = d.do(t, "GET", "/audit?limit=10", d.Key, nil, nil); r.Status != 200 || !strings.HasPrefix(string(r.Body), "[") {
		t.Fatalf("/audit: %d %s", r.Status, r.Body)
	}
	d.Crash()
	out, errs, code := runFence(t, nil, nil, "audit", "verify", "--data-dir", dataDir)
	if code != 0 || !strings.HasPrefix(out, "intact") {
		t.Fatalf("verify after SIGKILL: %d %q %q", code, out, errs)
	}
	d.Restart()
	d.Stop()
	out, errs, code = runFence(t, nil, nil, "audit", "verify", "--data-dir", dataDir)
	if code != 0 || !strings.HasPrefix(out, "intact") || strings.Contains(errs, "unsigned") {
		t.Fatalf("verify after a clean stop: %d %q %q", code, out, errs)
	}
	exp, _, code := runFence(t, nil, nil, "audit", "export", "--data-dir", dataDir)
	copyB, _ := os.ReadFile(fwd)
	if code != 0 || !strings.HasPrefix(exp, string(copyB)) {
		t.Fatalf("the forwarded copy is not a prefix of the log:\n%s\nvs\n%s", copyB, exp)
	}
	t.Logf("verify: %s%s", out, errs)
}

// TestAuditSources: what a sandbox's user does through the API reaches the
// audit trail from the daemon's own view: the create (variable names, not
// values), a command (argv, variable names, exit code, output hash), an
// upload (path, size, sha256), a refused flow, the kill; no value of a
// variable appears anywhere in the trail.
func TestAuditSources(t *testing.T) {
	dataDir := newDataDir(t)
	d := startDaemon(t, dataDir)
	const secret = "tok-VALUE-9f8e7d6c5b4a"
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal", EnvVars: map[string]string{"GLOBAL_TOKEN": secret}})
	e := sb.Envd().WithUser("root")
	out, _, st := run(t, e, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "echo hello; nc -w 2 198.51.100.7 80 </dev/null; exit 3"},
		Env: map[string]string{"CMD_TOKEN": secret}})
	if st.ExitCode != 3 || !strings.HasPrefix(out, "hello\n") {
		t.Fatalf("command: exit %d, %q", st.ExitCode, out)
	}
	content := strings.Repeat("audit me\n", 1000)
	if err := e.WriteFile(ctxT(t), "/tmp/up.txt", strings.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if err := sb.Kill(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	var recs []audit.Record
	eventually(t, 15*time.Second, "the sandbox's records", func() bool {
		exp, _, code := runFence(t, nil, nil, "audit", "export", "--data-dir", dataDir, "--sandbox", sb.ID())
		if code != 0 {
			return false
		}
		recs = nil
		for _, l := range strings.Split(strings.TrimSpace(exp), "\n") {
			var r audit.Record
			if json.Unmarshal([]byte(l), &r) == nil {
				recs = append(recs, r)
			}
		}
		kinds := map[string]bool{}
		for _, r := range recs {
			kinds[r.Type] = true
		}
		ok := kinds[audit.TypeCreate] && kinds[audit.TypeProcStart] && kinds[audit.TypeProcEnd] &&
			kinds[audit.TypeFileWrite] && kinds[audit.TypeFlow] && kinds[audit.TypeKill]
		return ok
	})
	all, _, _ := runFence(t, nil, nil, "audit", "export", "--data-dir", dataDir)
	if strings.Contains(all, secret) {
		t.Errorf("a variable's value is in the audit trail")
	}
	sum := sha256.Sum256([]byte(content))
	var sawStart, sawEnd, sawFile, sawFlow bool
	for _, r := range recs {
		data, _ := json.Marshal(r.Data)
		s := string(data)
		switch r.Type {
		case audit.TypeCreate:
			if !strings.Contains(s, "GLOBAL_TOKEN") || r.Actor != "team:"+tenancy.DefaultTeamID+" key:"+tenancy.BootstrapKeyID {
				t.Errorf("create record %s by %q, want the variable's name and the bootstrap key's team and ID", s, r.Actor)
			}
		case audit.TypeProcStart:
			sawStart = strings.Contains(s, `"cmd":"sh"`) && strings.Contains(s, "CMD_TOKEN") && strings.Contains(s, `"user":"root"`)
		case audit.TypeProcEnd:
			sawEnd = strings.Contains(s, `"exit_code":3`) && strings.Contains(s, `"output_sha256"`)
		case audit.TypeFileWrite:
			sawFile = strings.Contains(s, `"/tmp/up.txt"`) && strings.Contains(s, hex.EncodeToString(sum[:])) && strings.Contains(s, `"size":9000`)
		case audit.TypeFlow:
			sawFlow = sawFlow || strings.Contains(s, "198.51.100.7") && strings.Contains(s, `"decision":"deny"`)
		case audit.TypeKill:
			if !strings.Contains(s, `"reason":"request"`) {
				t.Errorf("kill record %s", s)
			}
		}
	}
	if !sawStart || !sawEnd || !sawFile || !sawFlow {
		t.Errorf("records start=%v end=%v file=%v flow=%v:\n%+v", sawStart, sawEnd, sawFile, sawFlow, recs)
	}
	if _, errs, code := runFence(t, nil, nil, "audit", "verify", "--data-dir", dataDir); code != 0 {
		t.Errorf("verify: exit %d %s", code, errs)
	}
}
