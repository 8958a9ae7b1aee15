package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// sshDaemon is a daemon serving SSH, with a registered key and a
// known_hosts file holding its host key.
type sshDaemon struct {
	*daemon
	port     string
	dir      string
	key      string // registered private key file
	hosts    string // known_hosts
	hostLine string
}

func startSSHDaemon(t *testing.T) *sshDaemon {
	t.Helper()
	for _, tool := range []string{"ssh", "sftp", "scp", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (openssh-client): %v", tool, err)
		}
	}
	d := startDaemon(t, newDataDir(t), "--ssh-addr", "127.0.0.1:0")
	var addr, fp string
	eventually(t, 30*time.Second, "the SSH server's start line", func() bool {
		_, rest, ok := strings.Cut(d.out.String(), "serving SSH on ")
		if !ok {
			return false
		}
		f := strings.Fields(rest)
		addr, fp = f[0], strings.TrimSuffix(f[4], ")")
		return true
	})
	_, port, _ := net.SplitHostPort(addr)
	s := &sshDaemon{daemon: d, port: port, dir: t.TempDir()}
	// The host key lives under the data dir, 0600; its fingerprint is the
	// one printed.
	keyFile := filepath.Join(d.DataDir, "ssh_host_ed25519_key")
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("host key %s: %v, %v; want mode 0600", keyFile, fi, err)
	}
	pub := strings.TrimSpace(command(t, "ssh-keygen", "-y", "-f", keyFile))
	if got := command(t, "sh", "-c", "ssh-keygen -lf - <<EOF\n"+pub+"\nEOF"); !strings.Contains(got, fp) {
		t.Fatalf("printed fingerprint %s, the host key's is %s", fp, got)
	}
	s.hostLine = fmt.Sprintf("[127.0.0.1]:%s %s\n", port, pub)
	s.hosts = filepath.Join(s.dir, "known_hosts")
	if err := os.WriteFile(s.hosts, []byte(s.hostLine), 0o600); err != nil {
		t.Fatal(err)
	}
	s.key = s.newKey(t, "k1")
	r := d.do(t, "POST", "/ssh-keys", d.Key, strings.NewReader(fmt.Sprintf(`{"publicKey":%q}`, s.pubKey(t, s.key))), nil)
	if r.Status != 201 {
		t.Fatalf("POST /ssh-keys = %d %s", r.Status, r.Body)
	}
	return s
}

func command(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %q: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func (s *sshDaemon) newKey(t *testing.T, name string) string {
	t.Helper()
	f := filepath.Join(s.dir, name)
	command(t, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", f)
	return f
}

func (s *sshDaemon) pubKey(t *testing.T, key string) string {
	t.Helper()
	b, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// opts are the options every OpenSSH tool gets: only key, the daemon's
// host key verified strictly, no prompts.
func (s *sshDaemon) opts(key string) []string {
	return []string{"-i", key, "-o", "IdentitiesOnly=yes", "-o", "UserKnownHostsFile=" + s.hosts,
		"-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
		"-o", "ConnectTimeout=30"}
}

// ssh runs ssh with args after the options, stdin given; it returns
// stdout, stderr and the exit code.
func (s *sshDaemon) ssh(t *testing.T, key, stdin string, args ...string) (string, string, int) {
	t.Helper()
	return s.tool(t, "ssh", stdin, append(append(s.opts(key), "-p", s.port), args...)...)
}

func (s *sshDaemon) tool(t *testing.T, name, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%s: %v", name, err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

func TestSSHExecAndShell(t *testing.T) {
	requireTemplate(t, "base")
	s := startSSHDaemon(t)
	sb := s.create(t, api.NewSandbox{TemplateID: "base"})
	target := sb.ID() + "@127.0.0.1"

	out, errOut, code := s.ssh(t, s.key, "", target, "whoami; echo oops >&2; exit 7")
	if out != "user\n" || errOut != "oops\n" || code != 7 {
		t.Errorf("ssh exec = %q, %q, exit %d; want user, oops, exit 7", out, errOut, code)
	}
	out, _, code = s.ssh(t, s.key, "hello from stdin", target, "cat; echo")
	if out != "hello from stdin\n" || code != 0 {
		t.Errorf("ssh exec with stdin = %q, exit %d", out, code)
	}
	// A PTY shell, as the template's user.
	out, _, code = s.ssh(t, s.key, "echo $((6*7)) $(whoami); tty; exit 3\n", "-tt", target)
	if !strings.Contains(out, "42 user") || !strings.Contains(out, "/dev/pts/") || code != 3 {
		t.Errorf("ssh -tt shell = %q, exit %d; want 42 user, a tty, exit 3", out, code)
	}

	// fence ssh wraps the system ssh: options and command after --.
	out, errOut, code = s.fenceCLI(t, nil, append(append([]string{"ssh", "--url", s.URL, "--port", s.port, sb.ID(), "--"},
		s.opts(s.key)...), "echo via-fence; exit 4")...)
	if out != "via-fence\n" || code != 4 {
		t.Errorf("fence ssh = %q, exit %d (%s); want via-fence, exit 4", out, code, errOut)
	}

	// The command is on the record, with its exit code and who ran it.
	r := s.do(t, "GET", "/audit?type=ssh.exec&sandbox="+sb.ID(), s.Key, nil, nil)
	if r.Status != 200 || !strings.Contains(string(r.Body), `"command":"whoami; echo oops`) {
		t.Errorf("audit of ssh.exec = %d %s", r.Status, r.Body)
	}
	if !strings.Contains(string(r.Body), `"exit_code":7`) || !strings.Contains(string(r.Body), ` ssh-key:sshkey_`) {
		t.Errorf("audit of ssh.exec lacks the exit code or the key: %s", r.Body)
	}
}

func TestSSHRefusesUnknownKeys(t *testing.T) {
	requireTemplate(t, "minimal")
	s := startSSHDaemon(t)
	sb := s.create(t, api.NewSandbox{TemplateID: "minimal"})
	other := s.newKey(t, "k2")
	_, errOut, code := s.ssh(t, other, "", sb.ID()+"@127.0.0.1", "true")
	if code != 255 || !strings.Contains(errOut, "Permission denied") {
		t.Errorf("ssh with an unregistered key = exit %d, %q; want 255, Permission denied", code, errOut)
	}
	// A deleted key stops working.
	r := s.do(t, "GET", "/ssh-keys", s.Key, nil, nil)
	var keys []struct{ ID string }
	if err := json.Unmarshal(r.Body, &keys); err != nil || len(keys) != 1 {
		t.Fatalf("GET /ssh-keys = %d %s", r.Status, r.Body)
	}
	if _, _, code := s.ssh(t, s.key, "", sb.ID()+"@127.0.0.1", "true"); code != 0 {
		t.Fatalf("ssh with the registered key = exit %d", code)
	}
	if r := s.do(t, "DELETE", "/ssh-keys/"+keys[0].ID, s.Key, nil, nil); r.Status != 204 {
		t.Fatalf("DELETE /ssh-keys = %d %s", r.Status, r.Body)
	}
	if _, _, code := s.ssh(t, s.key, "", sb.ID()+"@127.0.0.1", "true"); code != 255 {
		t.Errorf("ssh with a deleted key = exit %d, want 255", code)
	}
}

func TestSSHFileTransfer(t *testing.T) {
	requireTemplate(t, "base")
	s := startSSHDaemon(t)
	sb := s.create(t, api.NewSandbox{TemplateID: "base"})
	target := sb.ID() + "@127.0.0.1"
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	up := filepath.Join(s.dir, "up.bin")
	if err := os.WriteFile(up, data, 0o600); err != nil {
		t.Fatal(err)
	}
	down := filepath.Join(s.dir, "down.bin")
	batch := fmt.Sprintf("put %s /tmp/up.bin\nmkdir /tmp/d\nrename /tmp/up.bin /tmp/d/moved.bin\nget /tmp/d/moved.bin %s\nls /tmp/d\n", up, down)
	out, errOut, code := s.tool(t, "sftp", batch, append(append(s.opts(s.key), "-P", s.port, "-b", "-"), target)...)
	if code != 0 || !strings.Contains(out, "/tmp/d/moved.bin") {
		t.Fatalf("sftp = exit %d\n%s\n%s", code, out, errOut)
	}
	if got, err := os.ReadFile(down); err != nil || !bytes.Equal(got, data) {
		t.Errorf("downloaded %d bytes (%v), want the %d uploaded", len(got), err, len(data))
	}
	// The sandbox sees the file as its user's.
	got, _, _ := s.ssh(t, s.key, "", target, "stat -c '%s %U' /tmp/d/moved.bin")
	if want := strconv.Itoa(len(data)) + " user\n"; got != want {
		t.Errorf("stat in the sandbox = %q, want %q", got, want)
	}
	// scp (over SFTP), to and from the sandbox.
	if _, errOut, code := s.tool(t, "scp", "", append(append(s.opts(s.key), "-P", s.port), up, target+":scp.bin")...); code != 0 {
		t.Fatalf("scp up = exit %d: %s", code, errOut)
	}
	back := filepath.Join(s.dir, "back.bin")
	if _, errOut, code := s.tool(t, "scp", "", append(append(s.opts(s.key), "-P", s.port), target+":scp.bin", back)...); code != 0 {
		t.Fatalf("scp down = exit %d: %s", code, errOut)
	}
	if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, data) {
		t.Errorf("scp round trip: %d bytes (%v), want %d", len(got), err, len(data))
	}
	r := s.do(t, "GET", "/audit?type=ssh.sftp&sandbox="+sb.ID(), s.Key, nil, nil)
	if !strings.Contains(string(r.Body), fmt.Sprintf(`"bytes":%d`, len(data))) || !strings.Contains(string(r.Body), `/tmp/up.bin`) {
		t.Errorf("audit of ssh.sftp = %d %s", r.Status, r.Body)
	}
}

func TestSSHLocalForward(t *testing.T) {
	requireTemplate(t, "base")
	s := startSSHDaemon(t)
	sb := s.create(t, api.NewSandbox{TemplateID: "base"})
	target := sb.ID() + "@127.0.0.1"
	if _, errOut, code := s.ssh(t, s.key, "", target,
		"mkdir -p /tmp/www && echo forwarded > /tmp/www/f.txt && cd /tmp/www && nohup python3 -m http.server 8000 >/dev/null 2>&1 &"); code != 0 {
		t.Fatalf("starting the server: exit %d %s", code, errOut)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	local := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "ssh", append(append(s.opts(s.key), "-p", s.port, "-N",
		"-o", "ExitOnForwardFailure=yes", "-L", local+":localhost:8000"), target)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait() })
	var body string
	eventually(t, 60*time.Second, "the forwarded server to answer", func() bool {
		resp, err := http.Get("http://" + local + "/f.txt")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == 200
	})
	if body != "forwarded\n" {
		t.Errorf("through ssh -L: %q", body)
	}
}

func TestSSHResumesPausedSandbox(t *testing.T) {
	requireTemplate(t, "minimal")
	s := startSSHDaemon(t)
	sb := s.create(t, api.NewSandbox{TemplateID: "minimal"})
	ctx := ctxT(t)
	if err := s.Client.Pause(ctx, sb.ID()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	out, errOut, code := s.ssh(t, s.key, "", sb.ID()+"@127.0.0.1", "echo awake")
	if out != "awake\n" || code != 0 {
		t.Fatalf("ssh to a paused sandbox = %q, exit %d, %s", out, code, errOut)
	}
	if info, err := s.Client.Get(ctx, sb.ID()); err != nil || info.State != "running" {
		t.Errorf("after ssh: %+v, %v; want running", info, err)
	}
	// The API key works as the password, for scripts (and nothing else
	// does).
	for _, pw := range []string{s.Key, "e2b_wrong"} {
		askpass := filepath.Join(s.dir, "askpass")
		if err := os.WriteFile(askpass, []byte("#!/bin/sh\necho '"+pw+"'\n"), 0o700); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("ssh", "-o", "UserKnownHostsFile="+s.hosts, "-o", "StrictHostKeyChecking=yes",
			"-o", "PubkeyAuthentication=no", "-o", "NumberOfPasswordPrompts=1", "-o", "LogLevel=ERROR",
			"-p", s.port, sb.ID()+"@127.0.0.1", "echo by-password")
		cmd.Env = append(os.Environ(), "SSH_ASKPASS="+askpass, "SSH_ASKPASS_REQUIRE=force", "DISPLAY=none")
		out, _ := cmd.Output()
		if want := pw == s.Key; (string(out) == "by-password\n") != want {
			t.Errorf("ssh with password %q: %q; want success %v", pw, out, want)
		}
	}
}
