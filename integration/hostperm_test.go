package integration

import (
	"bytes"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fencesandbox/fence/api"
)

// TestHostUsersSeeNothing attacks the data dir from the host: a local user
// who is not root must not read, anywhere under the data dir or fence's
// state in /run, a sandbox's access token, the API key, the store, or a
// file written inside a sandbox. Every path root can see is tried directly
// by an unprivileged uid (directory listings aside, a known path opens if
// every parent can be searched), content searched for each secret.
func TestHostUsersSeeNothing(t *testing.T) {
	dataDir := newDataDir(t)
	d := startDaemon(t, dataDir)
	canary := "canary-" + randHex(12)
	envSecret := "envsecret-" + randHex(12)
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal", Secure: ptr(true), EnvVars: map[string]string{"FENCE_TEST_SECRET": envSecret}})
	if sb.EnvdAccessToken == "" {
		t.Fatal("the sandbox has no envd access token: the test would prove nothing")
	}
	e := sb.Envd()
	sh(t, e.WithUser("root"), "echo "+canary+" > /root/c && chmod 600 /root/c && echo "+canary+" > /tmp/c && chmod 644 /tmp/c && mkdir -p /srv/d && echo "+canary+" > /srv/d/c && chmod -R a+rX /srv && sync")
	sh(t, e, "echo "+canary+" > ~/c; sync")
	// The daemon has written the sandbox (and its token) to the store.
	needles := []string{canary, envSecret, sb.EnvdAccessToken, d.Key}

	var paths []string
	for _, root := range []string{dataDir, "/run/fence"} {
		filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if de.Type().IsRegular() || de.Type()&fs.ModeSocket != 0 {
				paths = append(paths, p)
			}
			return nil
		})
	}
	if !slicesContains(paths, filepath.Join(dataDir, "fence.db")) {
		t.Fatalf("no fence.db among the %d files under %s: %v", len(paths), dataDir, paths)
	}
	sockets := 0
	for _, p := range paths {
		if st, err := os.Lstat(p); err == nil && st.Mode()&fs.ModeSocket != 0 {
			sockets++
		}
	}
	if sockets == 0 {
		t.Fatalf("no agent socket among the files under %s: the socket check would prove nothing", dataDir)
	}
	t.Logf("%d files (%d sockets) under the data dir and /run/fence", len(paths), sockets)

	// As nobody (and with no supplementary group), try each path; report
	// what opens and what holds a secret.
	// A unix socket (an agent's, the daemon's) connects for whoever may
	// write it and search its directories: what access(W_OK) answers.
	script := `while IFS= read -r p; do
  if [ -S "$p" ]; then
    if [ -w "$p" ]; then echo "CONNECT $p"; fi
    continue
  fi
  if [ -r "$p" ] && head -c 1 -- "$p" >/dev/null 2>&1; then
    echo "READ $p"
    if head -c 268435456 -- "$p" 2>/dev/null | grep -qaF -f "$NEEDLES"; then echo "LEAK $p"; fi
  fi
done`
	// The needles file must be readable by nobody (t.TempDir's parent is
	// not): it doubles as the control below.
	nd, err := os.MkdirTemp("", "fence-needles-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(nd) })
	nf := filepath.Join(nd, "needles")
	if err := os.WriteFile(nf, []byte(strings.Join(needles, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(nd, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "NEEDLES=" + nf}
	cmd.Dir = "/"
	cmd.Stdin = strings.NewReader(strings.Join(paths, "\n") + "\n")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("walk as nobody: %v: %s", err, errb.String())
	}
	var readable, leaks []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if p, ok := strings.CutPrefix(l, "READ "); ok {
			readable = append(readable, p)
		}
		if p, ok := strings.CutPrefix(l, "LEAK "); ok {
			leaks = append(leaks, p)
		}
		if p, ok := strings.CutPrefix(l, "CONNECT "); ok {
			t.Errorf("as host uid 65534, the socket %s accepts connections", p)
		}
	}
	t.Logf("readable by nobody: %q", readable)
	for _, p := range leaks {
		t.Errorf("as host uid 65534, %s holds a secret (token, API key, sandbox env or a file written in the sandbox)", p)
	}
	for _, p := range readable {
		if b := filepath.Base(p); strings.HasPrefix(b, "fence.db") || b == "api-key" {
			t.Errorf("as host uid 65534, %s is readable", p)
		}
	}
	// Control: the same walk as nobody finds the secrets in a file it may
	// read (the needles themselves), so a silent walk means something.
	ctl := exec.Command("/bin/sh", "-c", script)
	ctl.Env = cmd.Env
	ctl.Dir = "/"
	ctlSock := filepath.Join(nd, "ctl.sock")
	ln, err := net.Listen("unix", ctlSock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chmod(ctlSock, 0o777); err != nil {
		t.Fatal(err)
	}
	ctl.Stdin = strings.NewReader(nf + "\n" + ctlSock + "\n")
	ctl.SysProcAttr = cmd.SysProcAttr
	if b, err := ctl.Output(); err != nil || !strings.Contains(string(b), "LEAK "+nf) || !strings.Contains(string(b), "CONNECT "+ctlSock) {
		t.Fatalf("control walk did not find a readable secret and an open socket: %v %q", err, b)
	}
}
