package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// TestExec proves the process API end to end through the daemon's proxy
// into a real sandbox's agent: exit codes, output streams, stdin, large
// binary output, signals, terminals, reconnecting to a background process,
// errors, users and environment. Root: the daemon creates namespaces,
// cgroups and mounts.
func TestExec(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal", EnvVars: map[string]string{"FENCE_IT": "from-create", "OVERRIDE": "create"}})
	e := sb.Envd()

	t.Run("exit codes", func(t *testing.T) {
		for _, want := range []int{0, 1, 42, 255} {
			_, _, st := run(t, e, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "exit " + strconv.Itoa(want)}})
			if st.ExitCode != want || st.Code() != want {
				t.Errorf("sh -c 'exit %d' = %+v, want exit code %d", want, st, want)
			}
		}
	})
	t.Run("stdout and stderr", func(t *testing.T) {
		out, errs, st := run(t, e, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "echo to-out; echo to-err >&2; echo more-out"}})
		if out != "to-out\nmore-out\n" || errs != "to-err\n" || st.ExitCode != 0 {
			t.Errorf("stdout %q, stderr %q, status %+v; want \"to-out\\nmore-out\\n\", \"to-err\\n\", 0", out, errs, st)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		ctx := ctxT(t)
		var out bytes.Buffer
		p, err := e.Start(ctx, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "cat; echo eof"}, Stdin: true, Stdout: &out})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		for _, chunk := range []string{"hello ", "world\n", strings.Repeat("z", 100000) + "\n"} {
			if err := p.SendStdin(ctx, []byte(chunk)); err != nil {
				t.Fatalf("SendStdin: %v", err)
			}
		}
		if err := p.CloseStdin(ctx); err != nil {
			t.Fatalf("CloseStdin: %v", err)
		}
		st, err := p.Wait()
		want := "hello world\n" + strings.Repeat("z", 100000) + "\neof\n"
		if err != nil || st.ExitCode != 0 || out.String() != want {
			t.Errorf("cat of stdin = %d bytes (%v, %+v), want the %d bytes sent then eof", out.Len(), err, st, len(want))
		}
	})
	t.Run("no stdin reads EOF", func(t *testing.T) {
		out, _, st := run(t, e, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "cat; echo done"}})
		if out != "done\n" || st.ExitCode != 0 {
			t.Errorf("cat without stdin = %q, %+v; want done", out, st)
		}
	})
	t.Run("large binary output", func(t *testing.T) {
		const size = 5 << 20
		sum := sh(t, e, "head -c "+strconv.Itoa(size)+" /dev/urandom > /tmp/big && sha256sum /tmp/big")
		want, _, _ := strings.Cut(sum, " ")
		var out bytes.Buffer
		h := sha256.New()
		ctx := ctxT(t)
		st, err := e.Run(ctx, client.ProcessSpec{Cmd: "cat", Args: []string{"/tmp/big"}, Stdout: io.MultiWriter(&out, h)})
		if err != nil || st.ExitCode != 0 {
			t.Fatalf("cat /tmp/big: %v, %+v", err, st)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != want || out.Len() != size {
			t.Errorf("cat of 5 MiB: %d bytes with sha256 %s, want %d bytes with %s", out.Len(), got, size, want)
		}
		// The file API returns the same bytes.
		rc, err := e.ReadFile(ctx, "/tmp/big")
		if err != nil {
			t.Fatalf("ReadFile: %v", err)
		}
		defer rc.Close()
		h2 := sha256.New()
		n, err := io.Copy(h2, rc)
		if err != nil || hex.EncodeToString(h2.Sum(nil)) != want || n != int64(size) {
			t.Errorf("ReadFile /tmp/big: %d bytes, %v, sha256 %x; want %d bytes with %s", n, err, h2.Sum(nil), size, want)
		}
	})
	t.Run("SIGKILL", func(t *testing.T) {
		ctx := ctxT(t)
		p, err := e.Start(ctx, client.ProcessSpec{Cmd: "sleep", Args: []string{"1000"}})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := p.Signal(ctx, syscall.SIGKILL); err != nil {
			t.Fatalf("Signal(SIGKILL): %v", err)
		}
		st, err := p.Wait()
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if sig, ok := st.Signal(); !ok || sig != syscall.SIGKILL || st.Code() != 137 || st.Exited {
			t.Errorf("sleep after SIGKILL = %+v, want killed by SIGKILL (code 137)", st)
		}
	})
	t.Run("SIGTERM", func(t *testing.T) {
		ctx := ctxT(t)
		p, err := e.Start(ctx, client.ProcessSpec{Cmd: "sleep", Args: []string{"1000"}})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := p.Signal(ctx, syscall.SIGTERM); err != nil {
			t.Fatalf("Signal(SIGTERM): %v", err)
		}
		st, err := p.Wait()
		if sig, ok := st.Signal(); err != nil || !ok || sig != syscall.SIGTERM {
			t.Errorf("sleep after SIGTERM = %+v, %v; want killed by SIGTERM", st, err)
		}
	})
	t.Run("PTY", func(t *testing.T) {
		out, _, st := run(t, e, client.ProcessSpec{Cmd: "stty", Args: []string{"size"}, PTY: &client.PTYSize{Cols: 123, Rows: 45}})
		if st.ExitCode != 0 || strings.TrimSpace(out) != "45 123" {
			t.Errorf("stty size on a 123x45 PTY = %q, %+v; want \"45 123\"", out, st)
		}
		// Resize, and input through the terminal.
		ctx := ctxT(t)
		var buf syncBuffer
		p, err := e.Start(ctx, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "read x; stty size; echo got-$x"}, PTY: &client.PTYSize{Cols: 80, Rows: 24}, Stdout: &buf})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := p.Resize(ctx, client.PTYSize{Cols: 100, Rows: 30}); err != nil {
			t.Fatalf("Resize: %v", err)
		}
		if err := p.SendStdin(ctx, []byte("abc\r")); err != nil {
			t.Fatalf("SendStdin: %v", err)
		}
		st, err = p.Wait()
		if err != nil || st.ExitCode != 0 || !strings.Contains(buf.String(), "30 100") || !strings.Contains(buf.String(), "got-abc") {
			t.Errorf("PTY session = %q, %+v, %v; want \"30 100\" after resize and got-abc", buf.String(), st, err)
		}
	})
	t.Run("background and reconnect", func(t *testing.T) {
		ctx := ctxT(t)
		p, err := e.Start(ctx, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "echo started; read x; echo got-$x"}, Stdin: true, Tag: "bg-job"})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		pid := p.PID
		p.Close() // stop listening; the process keeps running
		procs, err := e.ListProcesses(ctx)
		if err != nil {
			t.Fatalf("ListProcesses: %v", err)
		}
		found := false
		for _, pi := range procs {
			found = found || (pi.PID == pid && pi.Tag == "bg-job")
		}
		if !found {
			t.Fatalf("ListProcesses = %+v, want pid %d tagged bg-job", procs, pid)
		}
		var out syncBuffer
		p2, err := e.ConnectProcess(ctx, pid, &out, nil)
		if err != nil {
			t.Fatalf("ConnectProcess(%d): %v", pid, err)
		}
		if err := p2.SendStdin(ctx, []byte("xyz\n")); err != nil {
			t.Fatalf("SendStdin after reconnect: %v", err)
		}
		st, err := p2.Wait()
		if err != nil || st.ExitCode != 0 || !strings.Contains(out.String(), "got-xyz") {
			t.Errorf("reconnected process: output %q, %+v, %v; want got-xyz, exit 0", out.String(), st, err)
		}
		if _, err := e.ConnectProcess(ctx, 999999, nil, nil); err == nil {
			t.Errorf("ConnectProcess(unknown pid) succeeded")
		}
	})
	t.Run("command not found", func(t *testing.T) {
		ctx := ctxT(t)
		var out, errb bytes.Buffer
		st, err := e.Run(ctx, client.ProcessSpec{Cmd: "/no/such/command", Stdout: &out, Stderr: &errb})
		msg := ""
		if err != nil {
			msg = err.Error()
		} else {
			msg = st.Error + " " + st.Status + " " + errb.String()
			if st.ExitCode == 0 {
				t.Errorf("running /no/such/command = %+v, want a failure", st)
			}
		}
		t.Logf("running /no/such/command: %s", msg)
		if !strings.Contains(msg, "no such file") && !strings.Contains(msg, "not found") {
			t.Errorf("running /no/such/command: %q, want a clear \"not found\" / \"no such file\" error", msg)
		}
		_, err = e.Run(ctx, client.ProcessSpec{Cmd: "definitely-not-a-command"})
		if err == nil {
			t.Logf("definitely-not-a-command: no RPC error (status-level failure)")
		}
		// The sandbox still works.
		if out := sh(t, e, "echo alive"); out != "alive\n" {
			t.Errorf("after a failed start: %q", out)
		}
	})
	t.Run("users", func(t *testing.T) {
		for _, tc := range []struct{ user, uid, home string }{
			{"root", "0", "/root"},
			{"user", "1000", "/home/user"},
		} {
			out, _, st := run(t, e.WithUser(tc.user), client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "id -u; pwd"}})
			if st.ExitCode != 0 || out != tc.uid+"\n"+tc.home+"\n" {
				t.Errorf("as %s: id -u; pwd = %q, want %q", tc.user, out, tc.uid+"\n"+tc.home+"\n")
			}
		}
		out, _, _ := run(t, e, client.ProcessSpec{Cmd: "id", Args: []string{"-u"}, User: "root"})
		if out != "0\n" {
			t.Errorf("ProcessSpec.User root: id -u = %q, want 0", out)
		}
		ctx := ctxT(t)
		if _, err := e.WithUser("nosuchuser").Run(ctx, client.ProcessSpec{Cmd: "id"}); err == nil {
			t.Errorf("running as an unknown user succeeded")
		}
		// The user cannot become root through the sandbox's own files.
		out, _, st := run(t, e.WithUser("user"), client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "cat /etc/shadow 2>&1; touch /root/x 2>&1; echo rc=$?"}})
		if !strings.Contains(out, "rc=1") {
			t.Errorf("user touching /root: %q (%+v), want a permission failure", out, st)
		}
	})
	t.Run("env", func(t *testing.T) {
		out, _, _ := run(t, e, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "echo $FENCE_IT $OVERRIDE $PER_PROC"}, Env: map[string]string{"OVERRIDE": "proc", "PER_PROC": "p1"}})
		if out != "from-create proc p1\n" {
			t.Errorf("env = %q, want \"from-create proc p1\\n\" (create envVars, overridden per process)", out)
		}
		out, _, _ = run(t, e, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "echo ${PER_PROC:-unset}"}})
		if out != "unset\n" {
			t.Errorf("per-process env leaked into the next process: %q", out)
		}
		// The daemon's environment (its API key) never reaches the sandbox.
		out, _, _ = run(t, e.WithUser("root"), client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "env; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'"}})
		if strings.Contains(out, d.Key) || strings.Contains(out, "FENCE_API_KEY") {
			t.Errorf("the daemon's API key is visible in the sandbox environment:\n%s", out)
		}
	})
	t.Run("no network to the host", func(t *testing.T) {
		// The sandbox's only way out is the daemon's user-space stack,
		// which refuses the host (the daemon's API included), the
		// gateway, loopback elsewhere and metadata addresses.
		port := d.URL[strings.LastIndexByte(d.URL, ':')+1:]
		targets := []string{"127.0.0.1:" + port, "10.0.2.2:" + port, "10.0.2.3:" + port, "169.254.169.254:80"}
		for _, a := range hostIPv4s(t) {
			targets = append(targets, a+":"+port)
		}
		for _, target := range targets {
			out, _, st := run(t, e.WithUser("root"), client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "wget -q -O- http://" + target + "/health 2>&1; echo rc=$?"}})
			if st.ExitCode != 0 || strings.Contains(out, "rc=0") {
				t.Errorf("wget http://%s/health from inside = %q, want a failure", target, out)
			}
		}
		out := sh(t, e, "ip -o addr 2>/dev/null | awk '{print $2}' | sort -u | tr '\\n' ' '")
		if strings.TrimSpace(out) != "eth0 lo" {
			t.Errorf("network interfaces inside = %q, want eth0 (the daemon's stack) and lo", out)
		}
	})
	t.Run("cwd", func(t *testing.T) {
		out, _, _ := run(t, e, client.ProcessSpec{Cmd: "pwd", Cwd: "/tmp"})
		if out != "/tmp\n" {
			t.Errorf("pwd with Cwd /tmp = %q", out)
		}
	})
	t.Run("timeout kills", func(t *testing.T) {
		ctx := ctxT(t)
		st, err := e.Run(ctx, client.ProcessSpec{Cmd: "sleep", Args: []string{"1000"}, Timeout: 500 * time.Millisecond})
		if err == nil && st.Exited {
			t.Errorf("sleep 1000 with a 500ms timeout exited normally: %+v", st)
		}
		// No sleep is left running in the sandbox.
		eventually(t, 10*time.Second, "sleep 1000 gone after its timeout", func() bool {
			out := sh(t, e.WithUser("root"), "ps -o pid,args | grep '[s]leep 1000' || true")
			return out == ""
		})
	})
}

// hostIPv4s returns the host's IPv4 addresses.
func hostIPv4s(t *testing.T) []string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			out = append(out, ipn.IP.String())
		}
	}
	return out
}
