package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
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
