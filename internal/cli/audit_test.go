package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/audit"
)

func TestAuditVerifyAndExport(t *testing.T) {
	dir := t.TempDir()
	l, err := audit.Open(audit.Options{Dir: dir, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		sb := "aaa"
		if i%2 == 1 {
			sb = "bbb"
		}
		l.Append(context.Background(), audit.Event{Type: audit.TypeProcStart, SandboxID: sb, Data: map[string]any{"i": i}})
	}
	l.Append(context.Background(), audit.Event{Type: audit.TypeFlow, SandboxID: "aaa"})
	if err := l.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	// While the daemon's log is open: export works, verify warns of the
	// unsigned tail.
	code, out, _ := execute(t, Deps{}, "", "audit", "export", "--data-dir", dir, "--sandbox", "aaa", "--type", "egress.flow,process.start")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 16 || !strings.Contains(lines[15], `"type":"egress.flow"`) {
		t.Fatalf("export: %d %q", code, out)
	}
	code, out, stderr := execute(t, Deps{}, "", "audit", "verify", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "intact: 31 records") || !strings.Contains(stderr, "unsigned") {
		t.Fatalf("verify open log: %d %q %q", code, out, stderr)
	}
	l.Close()
	code, out, stderr = execute(t, Deps{}, "", "audit", "verify", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "intact: 32 records") || stderr != "" {
		t.Fatalf("verify closed log: %d %q %q", code, out, stderr)
	}
	// One edited byte: exit 1, the record named.
	segs, _ := filepath.Glob(filepath.Join(dir, "audit", "*.log"))
	b, _ := os.ReadFile(segs[0])
	os.WriteFile(segs[0], bytes.Replace(b, []byte(`{"i":4}`), []byte(`{"i":5}`), 1), 0o600)
	code, out, _ = execute(t, Deps{}, "", "audit", "verify", "--data-dir", dir)
	if code != 1 || !strings.Contains(out, "BROKEN: segment 00000000000000000001.log line 5 seq 5: record 5 was altered") {
		t.Fatalf("verify tampered log: %d %q", code, out)
	}
	if code, _, _ := execute(t, Deps{}, "", "audit", "export", "--data-dir", dir, "--since", "yesterday"); code != 2 {
		t.Fatalf("bad --since: %d", code)
	}
}
