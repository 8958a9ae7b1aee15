package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client/clienttest"
)

// daemon starts a fake daemon and points the client verbs at it through
// the environment.
func daemon(t *testing.T) *clienttest.Server {
	t.Helper()
	srv := clienttest.NewServer(t)
	t.Setenv("FENCE_URL", srv.URL)
	t.Setenv("FENCE_API_KEY", srv.APIKey)
	return srv
}

func TestExec(t *testing.T) {
	srv := daemon(t)
	id, _ := srv.AddSandbox(api.NewSandbox{TemplateID: "base"})
	tests := []struct {
		name       string
		stdin      string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"stdout", "", []string{id, "--", "echo", "hi"}, 0, "hi\n", ""},
		{"stderr", "", []string{id, "printerr", "oops"}, 0, "", "oops\n"},
		{"exit code", "", []string{id, "--", "exit", "7"}, 7, "", ""},
		{"signal", "", []string{id, "--", "kill"}, 137, "", ""},
		{"stdin only with -i", "data", []string{id, "--", "cat"}, 0, "", ""},
		{"stdin", "data", []string{"-i", id, "--", "cat"}, 0, "data", ""},
		{"tty without a terminal", "", []string{"-t", id, "--", "size"}, 0, "80 24\n", ""},
		{"user, workdir, env", "", []string{"-u", "root", "-w", "/tmp", "-e", "K=V", id, "--", "env"}, 0, "K=V\n", ""},
		{"unknown command", "", []string{id, "--", "nosuch"}, 1, "", "fence: starting process: invalid_argument: executable \"nosuch\" not found\n"},
		{"unknown sandbox", "", []string{"nosuch", "--", "true"}, 1, "", "fence: getting sandbox nosuch: 404: sandbox \"nosuch\" not found\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := execute(t, Deps{}, tt.stdin, append([]string{"exec"}, tt.args...)...)
			if code != tt.wantCode || stdout != tt.wantStdout || stderr != tt.wantStderr {
				t.Errorf("fence exec %v = %d, %q, %q; want %d, %q, %q", tt.args, code, stdout, stderr, tt.wantCode, tt.wantStdout, tt.wantStderr)
			}
		})
	}
	// The user selection and the sandbox's token went to the agent.
	var sawRoot bool
	for _, r := range srv.Agent(id).Requests() {
		if r.Header.Get("X-Access-Token") == "" {
			t.Errorf("fence exec sent %s without X-Access-Token", r.Path)
		}
		sawRoot = sawRoot || r.Header.Get("Authorization") == "Basic cm9vdDo="
	}
	if !sawRoot {
		t.Errorf("fence exec -u root sent no Basic auth for root")
	}
}

func TestSandboxVerbs(t *testing.T) {
	srv := daemon(t)
	code, id, stderr := execute(t, Deps{}, "", "sandbox", "create", "--template", "minimal", "--timeout", "90s", "--metadata", "owner=alice", "-e", "A=1")
	id = strings.TrimSpace(id)
	if code != 0 || id == "" {
		t.Fatalf("fence sandbox create = %d, %q, %q", code, id, stderr)
	}
	var body api.NewSandbox
	reqs := srv.Requests()
	json.Unmarshal(reqs[len(reqs)-1].Body, &body)
	if body.TemplateID != "minimal" || body.Timeout == nil || *body.Timeout != 90 || body.Metadata["owner"] != "alice" || body.EnvVars["A"] != "1" {
		t.Errorf("fence sandbox create sent %+v", body)
	}
	code, out, _ := execute(t, Deps{}, "", "sandbox", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "ID") || !strings.HasPrefix(lines[1], id+" ") || !strings.Contains(lines[1], "running") {
		t.Errorf("fence sandbox list = %d:\n%s", code, out)
	}
	code, out, _ = execute(t, Deps{}, "", "sandbox", "list", "--json")
	var listed []api.ListedSandbox
	if err := json.Unmarshal([]byte(out), &listed); code != 0 || err != nil || len(listed) != 1 || listed[0].SandboxID != id {
		t.Errorf("fence sandbox list --json = %d, %v, %q", code, err, out)
	}
	if code, _, stderr := execute(t, Deps{}, "", "sandbox", "timeout", id, "30"); code != 0 {
		t.Errorf("fence sandbox timeout = %d, %s", code, stderr)
	}
	reqs = srv.Requests()
	if r := reqs[len(reqs)-1]; r.Path != "/sandboxes/"+id+"/timeout" || strings.TrimSpace(string(r.Body)) != `{"timeout":30}` {
		t.Errorf("fence sandbox timeout sent %s %s", r.Path, r.Body)
	}
	code, _, stderr = execute(t, Deps{}, "", "sandbox", "kill", id, "nosuch")
	if code != 1 || !strings.HasPrefix(stderr, "fence: killing sandbox nosuch: 404") {
		t.Errorf("fence sandbox kill ID nosuch = %d, %q; want 1 naming nosuch", code, stderr)
	}
	if srv.Agent(id) != nil {
		t.Errorf("sandbox %s alive after fence sandbox kill", id)
	}
}

func TestAPIKeyResolution(t *testing.T) {
	srv := clienttest.NewServer(t)
	dataDir := t.TempDir()
	t.Setenv("FENCE_URL", "")
	t.Setenv("FENCE_API_KEY", "")
	args := []string{"sandbox", "list", "--url", srv.URL, "--data-dir", dataDir}
	if code, _, stderr := execute(t, Deps{}, "", args...); code != 1 || !strings.Contains(stderr, "no API key") {
		t.Errorf("fence sandbox list without a key = %d, %q", code, stderr)
	}
	os.WriteFile(filepath.Join(dataDir, "api-key"), []byte(srv.APIKey+"\n"), 0o600)
	if code, _, stderr := execute(t, Deps{}, "", args...); code != 0 {
		t.Errorf("fence sandbox list with DATA-DIR/api-key = %d, %q", code, stderr)
	}
	if code, _, stderr := execute(t, Deps{}, "", append(args, "--api-key", "wrong")...); code != 1 || !strings.Contains(stderr, "401") {
		t.Errorf("fence sandbox list --api-key wrong = %d, %q; want 1 and 401", code, stderr)
	}
}

func TestCp(t *testing.T) {
	srv := daemon(t)
	id, _ := srv.AddSandbox(api.NewSandbox{TemplateID: "base"})
	dir := t.TempDir()
	src := filepath.Join(dir, "in.txt")
	os.WriteFile(src, []byte("payload"), 0o644)
	if code, _, stderr := execute(t, Deps{}, "", "cp", src, id+":/tmp/"); code != 0 {
		t.Fatalf("fence cp upload = %d, %s", code, stderr)
	}
	if got, ok := srv.Agent(id).File("/tmp/in.txt"); !ok || string(got) != "payload" {
		t.Errorf("after upload /tmp/in.txt = %q, %v", got, ok)
	}
	if code, _, stderr := execute(t, Deps{}, "", "cp", id+":/tmp/in.txt", filepath.Join(dir, "out.txt")); code != 0 {
		t.Fatalf("fence cp download = %d, %s", code, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "out.txt")); string(b) != "payload" {
		t.Errorf("downloaded %q, want payload", b)
	}
	if code, out, _ := execute(t, Deps{}, "", "cp", id+":/tmp/in.txt", "-"); code != 0 || out != "payload" {
		t.Errorf("fence cp to stdout = %d, %q", code, out)
	}
	if code, _, _ := execute(t, Deps{}, "from stdin", "cp", "-", id+":/tmp/s.txt"); code != 0 {
		t.Errorf("fence cp from stdin = %d", code)
	}
	if got, _ := srv.Agent(id).File("/tmp/s.txt"); string(got) != "from stdin" {
		t.Errorf("after upload from stdin /tmp/s.txt = %q", got)
	}
	if code, _, stderr := execute(t, Deps{}, "", "cp", id+":/tmp/missing", dir); code != 1 || !strings.Contains(stderr, "404") {
		t.Errorf("fence cp of a missing file = %d, %q", code, stderr)
	}
}
