package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// TestCLI proves the CLI verbs against a real daemon: sandbox create, exec
// (output and exit code), cp both ways, list and kill. Root: the daemon
// creates namespaces, cgroups and mounts.
func TestCLI(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	tag := randHex(6)

	out, errs, code := d.fenceCLI(t, nil, "sandbox", "create", "--template", "minimal", "--metadata", "cli="+tag, "-e", "CLI_VAR=cv")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" || strings.ContainsAny(id, " \n") {
		t.Fatalf("fence sandbox create = %q, exit %d (stderr %q), want one ID", out, code, errs)
	}
	t.Cleanup(func() { d.Client.Kill(ctxT(t), id) })
	got, err := d.Client.Get(ctx, id)
	if err != nil || got.Metadata["cli"] != tag {
		t.Fatalf("Get(%s) after fence sandbox create = %+v, %v; want metadata cli=%s", id, got, err, tag)
	}

	out, errs, code = d.fenceCLI(t, nil, "exec", id, "--", "echo", "hi")
	if out != "hi\n" || code != 0 {
		t.Errorf("fence exec %s -- echo hi = %q, exit %d (stderr %q)", id, out, code, errs)
	}
	out, _, _ = d.fenceCLI(t, nil, "exec", id, "--", "sh", "-c", "echo $CLI_VAR")
	if out != "cv\n" {
		t.Errorf("fence exec: $CLI_VAR set by create -e = %q, want cv", out)
	}
	_, _, code = d.fenceCLI(t, nil, "exec", id, "--", "sh", "-c", "exit 5")
	if code != 5 {
		t.Errorf("fence exec -- sh -c 'exit 5' exited %d, want 5", code)
	}
	out, _, code = d.fenceCLI(t, strings.NewReader("piped input\n"), "exec", "-i", id, "--", "cat")
	if out != "piped input\n" || code != 0 {
		t.Errorf("fence exec -i -- cat = %q, exit %d, want the piped input", out, code)
	}
	out, _, _ = d.fenceCLI(t, nil, "exec", "-u", "root", "-w", "/tmp", id, "--", "sh", "-c", "id -u; pwd")
	if out != "0\n/tmp\n" {
		t.Errorf("fence exec -u root -w /tmp -- id -u; pwd = %q", out)
	}
	_, errs, code = d.fenceCLI(t, nil, "exec", "nosuchsandbox", "--", "true")
	if code == 0 || !strings.Contains(strings.ToLower(errs), "not found") {
		t.Errorf("fence exec on an unknown sandbox: exit %d, stderr %q; want a not-found error", code, errs)
	}

	// cp host → sandbox → host, binary content.
	dir := t.TempDir()
	content := make([]byte, 300<<10)
	rand.Read(content)
	src := filepath.Join(dir, "src.bin")
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := d.fenceCLI(t, nil, "cp", src, id+":/home/user/in.bin"); code != 0 {
		t.Fatalf("fence cp to sandbox: exit %d, stderr %q", code, errs)
	}
	out, _, _ = d.fenceCLI(t, nil, "exec", id, "--", "sh", "-c", "wc -c < /home/user/in.bin")
	if strings.TrimSpace(out) != "307200" {
		t.Errorf("size of the uploaded file in the sandbox = %q, want 307200", out)
	}
	if _, errs, code := d.fenceCLI(t, nil, "exec", id, "--", "cp", "/home/user/in.bin", "/home/user/out.bin"); code != 0 {
		t.Fatalf("cp in sandbox: %s", errs)
	}
	dst := filepath.Join(dir, "dst.bin")
	if _, errs, code := d.fenceCLI(t, nil, "cp", id+":/home/user/out.bin", dst); code != 0 {
		t.Fatalf("fence cp from sandbox: exit %d, stderr %q", code, errs)
	}
	if b, err := os.ReadFile(dst); err != nil || !bytes.Equal(b, content) {
		t.Errorf("round trip through fence cp: %d bytes, %v; want the %d bytes sent", len(b), err, len(content))
	}
	_, _, code = d.fenceCLI(t, strings.NewReader("via stdin"), "cp", "-", id+":/tmp/s.txt")
	if code != 0 {
		t.Errorf("fence cp - ID:/tmp/s.txt: exit %d", code)
	}
	out, _, _ = d.fenceCLI(t, nil, "cp", id+":/tmp/s.txt", "-")
	if out != "via stdin" {
		t.Errorf("fence cp ID:/tmp/s.txt - = %q, want \"via stdin\"", out)
	}
	if _, errs, code := d.fenceCLI(t, nil, "cp", id+":/no/such/file", filepath.Join(dir, "x")); code == 0 || !strings.Contains(errs, "404") || !strings.Contains(errs, "does not exist") {
		t.Errorf("fence cp of a missing file: exit %d, stderr %q; want a not-found error", code, errs)
	}

	// list: text and JSON, filtered by metadata.
	out, errs, code = d.fenceCLI(t, nil, "sandbox", "list")
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "ID") {
		t.Errorf("fence sandbox list = %q, exit %d (stderr %q), want a table with %s", out, code, errs, id)
	}
	out, _, _ = d.fenceCLI(t, nil, "sandbox", "list", "--json", "--metadata", "cli="+tag)
	var listed []api.ListedSandbox
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 1 || listed[0].SandboxID != id {
		t.Errorf("fence sandbox list --json --metadata cli=%s = %q (%v), want exactly %s", tag, out, err, id)
	}
	out, _, _ = d.fenceCLI(t, nil, "sandbox", "list", "--json", "--metadata", "cli=none")
	if strings.TrimSpace(out) != "[]" {
		t.Errorf("fence sandbox list --json with a filter matching nothing = %q, want []", out)
	}

	// timeout, then kill.
	if _, errs, code := d.fenceCLI(t, nil, "sandbox", "timeout", id, "600"); code != 0 {
		t.Errorf("fence sandbox timeout: exit %d, stderr %q", code, errs)
	}
	if _, errs, code := d.fenceCLI(t, nil, "sandbox", "kill", id); code != 0 {
		t.Fatalf("fence sandbox kill: exit %d, stderr %q", code, errs)
	}
	if _, err := d.Client.Get(ctx, id); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get after fence sandbox kill = %v, want not found", err)
	}
	out, _, _ = d.fenceCLI(t, nil, "sandbox", "list")
	if strings.Contains(out, id) {
		t.Errorf("fence sandbox list after kill still shows %s:\n%s", id, out)
	}
	if _, _, code := d.fenceCLI(t, nil, "sandbox", "kill", id); code == 0 {
		t.Errorf("fence sandbox kill of a killed sandbox exited 0")
	}
	// A wrong key is refused.
	_, errs, code = runFence(t, []string{"FENCE_URL=" + d.URL, "FENCE_API_KEY=e2b_wrong"}, nil, "sandbox", "list")
	if code == 0 || !strings.Contains(errs, "401") && !strings.Contains(strings.ToLower(errs), "api key") {
		t.Errorf("fence sandbox list with a wrong key: exit %d, stderr %q; want a 401", code, errs)
	}
	list, err := d.Client.List(ctx, client.ListOptions{})
	if err != nil || len(list) != 0 {
		t.Errorf("List after the CLI test = %q, %v; want none", listedIDs(list), err)
	}
}
