package integration

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/testutil"
)

// idleLifecycle is lifecycle.idleTimeout of s seconds.
func idleLifecycle(s int64) *api.NewLifecycle { return &api.NewLifecycle{IdleTimeout: &s} }

// waitState polls GET /sandboxes/{id} (which is no use of the sandbox)
// until it shows state, and returns what it showed. A pause is waited
// for to its end: endAt shows the pause time (while it is being paused
// the sandbox shows paused with its deadline).
func waitState(t *testing.T, d *daemon, id, state string, within time.Duration) *api.SandboxDetail {
	t.Helper()
	var info *api.SandboxDetail
	eventually(t, within, "sandbox "+id+" to be "+state, func() bool {
		var err error
		info, err = d.Client.Get(ctxT(t), id)
		if err != nil {
			t.Fatalf("Get(%s): %v", id, err)
		}
		return info.State == state && (state != "paused" || !info.EndAt.After(time.Now()))
	})
	return info
}

// TestIdlePauseResumesOnTraffic: a sandbox idle for its
// lifecycle.idleTimeout is paused; an envd request through the proxy
// resumes it with its files, and its deadline is pushed by the time it
// spent paused (what it had left at the pause, it has at the resume);
// once idle again it is paused again, and an API connect resumes it, as
// does a timeout request.
// Root: namespaces, cgroups.
func TestIdlePauseResumesOnTraffic(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal", Timeout: ptr(int32(600)), Lifecycle: idleLifecycle(2)})
	sh(t, sb.Envd(), "echo kept > /tmp/file")
	used := time.Now()
	before, err := d.Client.Get(ctx, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	if before.Lifecycle == nil || before.Lifecycle.IdleTimeout != 2 {
		t.Errorf("lifecycle = %+v, want idleTimeout 2", before.Lifecycle)
	}
	paused := waitState(t, d, sb.ID(), "paused", 2*time.Minute)
	t.Logf("idle pause: paused %v after the idle timeout ran out", paused.EndAt.Sub(used.Add(2*time.Second)))
	// EndAt of a paused sandbox is its pause time.
	pausedFor := time.Now()

	start := time.Now()
	if got := strings.TrimSpace(sh(t, sb.Envd(), "cat /tmp/file")); got != "kept" {
		t.Fatalf("/tmp/file after the resume on traffic = %q, want kept", got)
	}
	t.Logf("resume on envd traffic: the request answered in %v", time.Since(start))
	after, err := d.Client.Get(ctx, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	if after.State != "running" {
		t.Fatalf("state after traffic = %s, want running", after.State)
	}
	// What it had left at the pause, it has from the resume.
	leftAtPause := before.EndAt.Sub(paused.EndAt)
	leftAtResume := after.EndAt.Sub(after.StartedAt)
	if diff := leftAtResume - leftAtPause; diff < -time.Second || diff > time.Second {
		t.Errorf("deadline ahead at the resume %v, at the pause %v: the time paused was counted", leftAtResume, leftAtPause)
	}
	if moved := after.EndAt.Sub(before.EndAt); moved < time.Since(pausedFor)-time.Since(start) {
		t.Errorf("endAt moved by %v, less than the time seen paused", moved)
	}

	// Idle again: paused again; a connect resumes it.
	waitState(t, d, sb.ID(), "paused", 2*time.Minute)
	start = time.Now()
	if _, err := d.Client.Connect(ctx, sb.ID(), 0); err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Logf("resume on connect: %v", time.Since(start))
	info, err := d.Client.Get(ctx, sb.ID())
	if err != nil || info.State != "running" {
		t.Fatalf("after connect: %+v, %v; want running", info, err)
	}
	if got := strings.TrimSpace(sh(t, sb.Envd(), "cat /tmp/file")); got != "kept" {
		t.Errorf("/tmp/file after connect = %q, want kept", got)
	}

	// Idle again: a timeout request (the SDK's setTimeout) is served, not
	// refused as for a sandbox its owner paused.
	waitState(t, d, sb.ID(), "paused", 2*time.Minute)
	if err := sb.SetTimeout(ctx, 10*time.Minute); err != nil {
		t.Fatalf("SetTimeout on a sandbox paused for idleness: %v", err)
	}
	if info, err := d.Client.Get(ctx, sb.ID()); err != nil || info.State != "running" {
		t.Fatalf("after SetTimeout: %+v, %v; want running", info, err)
	}
}

// TestIdlePauseResumesOnPortTraffic: a request to a port of a sandbox
// paused for idleness resumes it and is answered by the server it ran.
func TestIdlePauseResumesOnPortTraffic(t *testing.T) {
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{TemplateID: "base", Lifecycle: idleLifecycle(2)})
	sh(t, sb.Envd(), `mkdir -p /tmp/www && echo served-after-idle > /tmp/www/index.html && (cd /tmp/www && python3 -m http.server 8000 </dev/null >/dev/null 2>&1 &)`)
	eventually(t, time.Minute, "the server to listen", func() bool { return httpOn(t, d, sb, "8000").Status == 200 })
	waitState(t, d, sb.ID(), "paused", 2*time.Minute)
	r := httpOn(t, d, sb, "8000")
	if r.Status != 200 || !strings.Contains(string(r.Body), "served-after-idle") {
		t.Fatalf("GET on port 8000 of the idle-paused sandbox = %d %q, want the page", r.Status, r.Body)
	}
	if info, err := d.Client.Get(ctxT(t), sb.ID()); err != nil || info.State != "running" {
		t.Fatalf("after port traffic: %+v, %v; want running", info, err)
	}
}

// TestIdlePauseBusyLoopKeepsRunning: a sandbox whose processes use CPU is
// not idle, however long it gets no traffic, while its idle twin is
// paused; once the loop stops it is paused too.
func TestIdlePauseBusyLoopKeepsRunning(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t))
	busy := d.create(t, api.NewSandbox{TemplateID: "minimal", Lifecycle: idleLifecycle(2)})
	quiet := d.create(t, api.NewSandbox{TemplateID: "minimal", Lifecycle: idleLifecycle(2)})
	sh(t, busy.Envd(), `(while :; do :; done) </dev/null >/dev/null 2>&1 & echo $! > /tmp/loop`)
	sh(t, quiet.Envd(), "true")
	waitState(t, d, quiet.ID(), "paused", 2*time.Minute)
	// Four more idle timeouts without traffic to the busy one.
	for range 8 {
		info, err := d.Client.Get(ctxT(t), busy.ID())
		if err != nil || info.State != "running" {
			t.Fatalf("the sandbox running a busy loop: %+v, %v; want running", info, err)
		}
		time.Sleep(time.Second)
	}
	sh(t, busy.Envd(), `kill "$(cat /tmp/loop)"`)
	waitState(t, d, busy.ID(), "paused", 2*time.Minute)
}

// TestIdlePauseBadInput: an idle timeout out of range is 400 and creates
// nothing; 0 is accepted (never paused for idleness).
func TestIdlePauseBadInput(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t), "--idle-pause", "1h")
	for _, body := range []string{
		`{"templateID":"minimal","lifecycle":{"idleTimeout":-1}}`,
		`{"templateID":"minimal","lifecycle":{"idleTimeout":2592001}}`,
		`{"templateID":"minimal","lifecycle":{"idleTimeout":99999999999999999}}`,
		`{"templateID":"minimal","lifecycle":{"idleTimeout":1.5}}`,
		`{"templateID":"minimal","lifecycle":{"idleTimeout":"60"}}`,
	} {
		r := d.do(t, "POST", "/sandboxes", d.Key, strings.NewReader(body), nil)
		if r.Status != 400 {
			t.Errorf("create %s = %d %s, want 400", body, r.Status, r.Body)
		}
	}
	if ids := d.sandboxIDs(); len(ids) != 0 {
		t.Errorf("sandboxes after refused creates: %v", ids)
	}
	off := d.create(t, api.NewSandbox{TemplateID: "minimal", Lifecycle: idleLifecycle(0)})
	byDefault := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	for id, want := range map[string]int64{off.ID(): 0, byDefault.ID(): 3600} {
		info, err := d.Client.Get(ctxT(t), id)
		if err != nil || info.Lifecycle == nil || info.Lifecycle.IdleTimeout != want {
			t.Errorf("lifecycle of %s = %+v, %v; want idleTimeout %d", id, info.Lifecycle, err, want)
		}
	}
}

// TestMaxLifetime: the daemon caps timeouts at 24 h by default; with
// --max-lifetime 0 a timeout past 24 h is accepted, and a team's maximum
// lifetime still applies.
func TestMaxLifetime(t *testing.T) {
	requireTemplate(t, "minimal")
	long := `{"templateID":"minimal","timeout":90000}`
	d := startDaemon(t, newDataDir(t))
	if r := d.do(t, "POST", "/sandboxes", d.Key, strings.NewReader(long), nil); r.Status != 400 {
		t.Errorf("create with a 25 h timeout under the default cap = %d %s, want 400", r.Status, r.Body)
	}

	d = startDaemon(t, newDataDir(t), "--max-lifetime", "0")
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal", Timeout: ptr(int32(90000))})
	if info, err := d.Client.Get(ctxT(t), sb.ID()); err != nil || info.EndAt.Sub(info.StartedAt) != 90000*time.Second {
		t.Errorf("Get = %+v, %v; want endAt - startedAt = 25h", info, err)
	}
	if _, err := d.Client.Connect(ctxT(t), sb.ID(), 48*time.Hour); err != nil {
		t.Errorf("connect with a 48 h timeout and no cap: %v", err)
	}

	d = startDaemon(t, newDataDir(t), "--max-lifetime", "0", "--team-max-lifetime", "1h")
	if r := d.do(t, "POST", "/sandboxes", d.Key, strings.NewReader(long), nil); r.Status != 400 {
		t.Errorf("create with a 25 h timeout under a team's 1 h maximum = %d %s, want 400", r.Status, r.Body)
	}
}

// TestIdlePauseSSH: an open SSH session keeps its sandbox running
// however idle; once it ends the sandbox is paused, and an SSH connect
// resumes it with its files.
func TestIdlePauseSSH(t *testing.T) {
	requireTemplate(t, "base")
	s := startSSHDaemon(t)
	sb := s.create(t, api.NewSandbox{TemplateID: "base", Lifecycle: idleLifecycle(2)})
	sh(t, sb.Envd(), "echo kept > /tmp/file")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	session := exec.CommandContext(ctx, "ssh", append(append(s.opts(s.key), "-p", s.port), sb.ID()+"@127.0.0.1", "sleep 6")...)
	if err := session.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- session.Wait() }()
	for open := true; open; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("ssh sleep 6: %v", err)
			}
			open = false
		case <-time.After(500 * time.Millisecond):
			info, err := s.Client.Get(ctxT(t), sb.ID())
			if err != nil || info.State != "running" {
				t.Fatalf("during an SSH session: %+v, %v; want running", info, err)
			}
		}
	}
	waitState(t, s.daemon, sb.ID(), "paused", 2*time.Minute)
	start := time.Now()
	out, errOut, code := s.ssh(t, s.key, "", sb.ID()+"@127.0.0.1", "cat /tmp/file")
	if code != 0 || strings.TrimSpace(out) != "kept" {
		t.Fatalf("ssh cat /tmp/file on the idle-paused sandbox = %q %q %d, want kept", out, errOut, code)
	}
	t.Logf("ssh exec on an idle-paused sandbox: %v", time.Since(start))
}

// TestIdlePauseGvisorKeepsProcesses: on gvisor an idle pause is a
// checkpoint with the memory: a connect resumes the sandbox with the
// process it ran (a counting loop counts on) and its files; a sandbox
// paused for idleness stays so across a daemon crash, and traffic still
// resumes it. Root: namespaces, cgroups, runsc.
func TestIdlePauseGvisorKeepsProcesses(t *testing.T) {
	testutil.RequireRunsc(t)
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	// Not d.create: its cleanup would reach the first daemon, not the
	// restarted one.
	sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "base", Metadata: gvisorMeta, Lifecycle: idleLifecycle(3)})
	if err != nil {
		t.Fatalf("Create(gvisor): %v", err)
	}
	t.Cleanup(func() { _ = d.Client.Kill(context.Background(), sb.ID()) })
	e := sb.Envd()
	sh(t, e, `echo kept > /tmp/file; (i=0; while :; do i=$((i+1)); echo $i > /tmp/c.n && mv -f /tmp/c.n /tmp/c; sleep 1; done) </dev/null >/dev/null 2>&1 &`)
	used := time.Now()
	paused := waitState(t, d, sb.ID(), "paused", 3*time.Minute)
	t.Logf("gvisor idle pause: paused %v after the idle timeout ran out", paused.EndAt.Sub(used.Add(3*time.Second)))
	start := time.Now()
	if _, err := d.Client.Connect(ctx, sb.ID(), 0); err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Logf("gvisor resume on connect: %v", time.Since(start))
	c1 := counterVia(t, e)
	eventually(t, time.Minute, "the loop started before the idle pause to count on", func() bool {
		return counterVia(t, e) > c1
	})
	if got := strings.TrimSpace(sh(t, e, "cat /tmp/file")); got != "kept" {
		t.Errorf("/tmp/file = %q, want kept", got)
	}

	// Idle again, then the daemon is killed: the next one adopts the
	// sandbox paused for idleness, and envd traffic (it has no
	// autoResume) resumes it with its process.
	waitState(t, d, sb.ID(), "paused", 3*time.Minute)
	d.Crash()
	d.Restart()
	e = d.Client.Sandbox(sb.ID(), sb.EnvdAccessToken).Envd()
	c2 := counterVia(t, e)
	if c2 < c1 {
		t.Fatalf("counter %d after the restart, %d before: the loop did not keep its state", c2, c1)
	}
	eventually(t, time.Minute, "the loop to count on after the restart", func() bool {
		return counterVia(t, e) > c2
	})
}
