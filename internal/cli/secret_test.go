package cli

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/downloads"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/httpapi"
	"github.com/fencesandbox/fence/internal/secrets"
	"github.com/fencesandbox/fence/internal/store"
)

// secretDaemon serves the real /secrets and downloads routes over a real
// store, and points the client verbs at it.
func secretDaemon(t *testing.T) (*secrets.Store, *downloads.Log) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(dir, "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sec, err := secrets.Open(secrets.Options{DB: st, KeyPath: filepath.Join(dir, "secrets.key")})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := downloads.Open(t.Context(), st, downloads.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const key = "e2b_00112233445566778899"
	srv := httptest.NewServer(httpapi.New(httpapi.Options{APIKey: key, Secrets: sec, Downloads: dl}))
	t.Cleanup(srv.Close)
	t.Setenv("FENCE_URL", srv.URL)
	t.Setenv("FENCE_API_KEY", key)
	return sec, dl
}

func TestSecretVerbs(t *testing.T) {
	sec, _ := secretDaemon(t)
	ctx := t.Context()
	const value = "sk-VALUE-51d0e9c3"
	code, out, stderr := execute(t, Deps{}, value+"\n", "secret", "create", "OpenAI-Key", "--metadata", "team=ml")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sec_") || len(id) != 30 {
		t.Fatalf("fence secret create = %d %q %q", code, out, stderr)
	}
	// One trailing newline is dropped.
	if v, err := sec.Value(ctx, "openai-key"); err != nil || v != value {
		t.Errorf("stored value %q, %v", v, err)
	}
	file := filepath.Join(t.TempDir(), "v")
	os.WriteFile(file, []byte("from-file\n\n"), 0o600)
	if code, out, stderr := execute(t, Deps{}, "", "secret", "update", id, "--value-file", file); code != 0 || !strings.Contains(out, "version 2") {
		t.Errorf("fence secret update --value-file = %d %q %q", code, out, stderr)
	}
	if v, _ := sec.Value(ctx, id); v != "from-file\n" {
		t.Errorf("value from file %q, want one newline dropped", v)
	}
	if code, _, _ := execute(t, Deps{}, "x\n", "secret", "update", "openai-key", "--keep-newline"); code != 0 {
		t.Errorf("update --keep-newline = %d", code)
	}
	if v, _ := sec.Value(ctx, id); v != "x\n" {
		t.Errorf("value with --keep-newline %q", v)
	}

	code, out, _ = execute(t, Deps{}, "", "secret", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), id+" openai-key 3 ") || !strings.HasSuffix(lines[1], "team=ml") {
		t.Errorf("fence secret list = %d:\n%s", code, out)
	}
	code, out, _ = execute(t, Deps{}, "", "secret", "get", "OPENAI-KEY", "--json")
	var got []api.Secret
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got) != 1 || got[0].SecretID != id || got[0].CurrentVersion != 3 {
		t.Errorf("fence secret get --json = %d %v %s", code, err, out)
	}
	if strings.Contains(out, "value") {
		t.Errorf("get prints a value key: %s", out)
	}

	// Refused: an empty value, a value on the command line, a taken name.
	for _, tc := range []struct {
		stdin string
		args  []string
		code  int
	}{
		{"", []string{"secret", "create", "empty"}, 2},
		{"\n", []string{"secret", "create", "empty"}, 2},
		{strings.Repeat("v", 64<<10+1), []string{"secret", "create", "big"}, 2},
		{"v", []string{"secret", "create", "k", "--value", "v"}, 2},
		{"v", []string{"secret", "create", "openai-key"}, 1},
		{"v", []string{"secret", "create", "a.b"}, 1},
		{"v", []string{"secret", "update", "k", "--metadata", "a=b", "--clear-metadata"}, 2},
	} {
		if code, _, stderr := execute(t, Deps{}, tc.stdin, tc.args...); code != tc.code || !strings.HasPrefix(stderr, "fence: ") {
			t.Errorf("fence %v = %d %q, want %d", tc.args, code, stderr, tc.code)
		}
	}

	code, _, stderr = execute(t, Deps{}, "", "secret", "delete", "openai-key", "nosuch")
	if code != 1 || !strings.Contains(stderr, "deleting secret nosuch: 404: Secret not found") {
		t.Errorf("fence secret delete openai-key nosuch = %d %q", code, stderr)
	}
	if _, err := sec.Get(ctx, id); err == nil {
		t.Error("secret still there after fence secret delete")
	}
	code, out, _ = execute(t, Deps{}, "", "secret", "list", "--json")
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("fence secret list --json on an empty store = %d %q", code, out)
	}
}

func TestSandboxDownloadsVerb(t *testing.T) {
	_, dl := secretDaemon(t)
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	sum := strings.Repeat("0f", 32)
	if err := dl.RecordDownload(t.Context(), gateway.Download{SandboxID: "sbx1", Time: at, Ecosystem: "pypi",
		Name: "requests", Version: "2.32.3", URL: "https://files.pythonhosted.org/r.whl", Size: 64_000, SHA256: sum}); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := execute(t, Deps{}, "", "sandbox", "downloads", "sbx1")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "TIME") ||
		!strings.Contains(strings.Join(strings.Fields(lines[1]), " "), "pypi requests 2.32.3 64000") || !strings.HasSuffix(lines[1], "https://files.pythonhosted.org/r.whl") {
		t.Errorf("fence sandbox downloads = %d %q:\n%s", code, stderr, out)
	}
	code, out, _ = execute(t, Deps{}, "", "sandbox", "downloads", "sbx1", "--json")
	var got []api.Download
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got) != 1 || got[0].SHA256 != sum || !got[0].Time.Equal(at) {
		t.Errorf("fence sandbox downloads --json = %d %v %s", code, err, out)
	}
	if code, _, stderr := execute(t, Deps{}, "", "sandbox", "downloads", "nosuch"); code != 1 || !strings.Contains(stderr, "404") {
		t.Errorf("fence sandbox downloads nosuch = %d %q", code, stderr)
	}
}

func TestSecretHelp(t *testing.T) {
	for _, c := range [][]string{{"secret", "create"}, {"secret", "update"}, {"secret", "list"}, {"secret", "get"},
		{"secret", "delete"}, {"sandbox", "downloads"}} {
		code, out, _ := execute(t, Deps{}, "", append(c, "--help")...)
		if code != 0 || !strings.Contains(out, "Examples:") || !strings.Contains(out, "fence ") {
			t.Errorf("fence %s --help = %d:\n%s", strings.Join(c, " "), code, out)
		}
	}
	_, out, _ := execute(t, Deps{}, "", "secret", "--help")
	if !strings.Contains(out, "never") || !strings.Contains(out, "${e2b.secrets.NAME}") {
		t.Errorf("fence secret --help does not explain values:\n%s", out)
	}
}
