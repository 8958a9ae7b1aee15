package integration

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/testutil"
)

// gvisorMeta selects the gvisor backend for one create.
var gvisorMeta = map[string]string{"fence.backend": "gvisor"}

// counterVia reads the counting loop's /tmp/c through envd.
func counterVia(t *testing.T, e *client.Envd) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(sh(t, e, "cat /tmp/c 2>/dev/null || echo 0")))
	if err != nil {
		t.Fatalf("reading /tmp/c: %v", err)
	}
	return n
}

// httpOn does GET / on port of the sandbox through the daemon's proxy.
func httpOn(t *testing.T, d *daemon, sb *client.Sandbox, port string) rawResponse {
	t.Helper()
	return d.do(t, "GET", "/", "", nil, map[string]string{
		api.HeaderSandboxID: sb.ID(), api.HeaderSandboxPort: port, api.HeaderAccessToken: sb.EnvdAccessToken})
}

// TestGvisorPauseKeepsMemoryAcrossRestart proves that on the gvisor
// backend a pause keeps memory and processes: a python3 http.server and a
// shell loop started before the pause serve and count after the resume,
// also when the daemon was killed with SIGKILL while the sandbox was paused
// (the checkpoint image on disk is the state, and the next daemon adopts
// it). The sandbox is picked per create (metadata fence.backend) on a
// daemon whose default is native. Root: namespaces, cgroups, runsc.
func TestGvisorPauseKeepsMemoryAcrossRestart(t *testing.T) {
	testutil.RequireRunsc(t)
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "base", Metadata: gvisorMeta})
	if err != nil {
		t.Fatalf("Create(gvisor): %v", err)
	}
	killAtEnd := func() {
		if err := d.Client.Kill(ctxT(t), sb.ID()); err != nil && !errors.Is(err, api.ErrNotFound) {
			t.Errorf("Kill: %v", err)
		}
	}
	defer killAtEnd()
	e := sb.Envd()
	// The kernel the sandbox sees is gVisor's.
	if out := sh(t, e, "dmesg 2>/dev/null | head -1; cat /proc/version"); !strings.Contains(out, "gVisor") && !strings.Contains(out, "Starting gVisor") {
		t.Logf("kernel banner: %q", out)
	}
	sh(t, e, `mkdir -p /tmp/www && echo served-from-memory > /tmp/www/index.html && cd /tmp/www && (python3 -m http.server 8000 </dev/null >/dev/null 2>&1 &) ; `+
		`(i=0; while :; do i=$((i+1)); echo $i > /tmp/c.n && mv -f /tmp/c.n /tmp/c; sleep 0.1; done) </dev/null >/dev/null 2>&1 &`)
	eventually(t, 30*time.Second, "the http server to serve", func() bool {
		r := httpOn(t, d, sb, "8000")
		return r.Status == 200 && strings.Contains(string(r.Body), "served-from-memory")
	})
	c1 := counterVia(t, e)

	start := time.Now()
	if err := d.Client.Pause(ctx, sb.ID()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	t.Logf("pause (runsc checkpoint) took %v", time.Since(start))
	if r := httpOn(t, d, sb, "8000"); r.Status != 502 {
		t.Errorf("GET on port 8000 of the paused sandbox = %d %s, want 502", r.Status, r.Body)
	}
	d.Crash()
	d.Restart()
	info, err := d.Client.Get(ctx, sb.ID())
	if err != nil || info.State != "paused" || info.EnvdAccessToken != sb.EnvdAccessToken {
		t.Fatalf("Get after the restart = %+v, %v; want paused with the same token", info, err)
	}
	start = time.Now()
	resumed, err := d.Client.Connect(ctx, sb.ID(), 5*time.Minute)
	if err != nil {
		t.Fatalf("Connect (resume after restart): %v", err)
	}
	t.Logf("resume (runsc restore) through connect took %v", time.Since(start))
	sb = resumed
	c2 := counterVia(t, sb.Envd())
	t.Logf("counter: %d before the pause, %d after the restart and resume", c1, c2)
	if c2 < c1 || c2-c1 > 20 {
		t.Errorf("counter went from %d to %d: the loop did not keep its state", c1, c2)
	}
	eventually(t, 30*time.Second, "the counter to continue", func() bool { return counterVia(t, sb.Envd()) > c2 })
	r := httpOn(t, d, sb, "8000")
	if r.Status != 200 || !strings.Contains(string(r.Body), "served-from-memory") {
		t.Errorf("GET on port 8000 after resume = %d %q, want the page the server served before the pause", r.Status, r.Body)
	}
	// Pause again and kill while paused: the record and the image go.
	if err := d.Client.Pause(ctx, sb.ID()); err != nil {
		t.Fatalf("second Pause: %v", err)
	}
	if err := d.Client.Kill(ctx, sb.ID()); err != nil {
		t.Fatalf("Kill(paused): %v", err)
	}
	if _, err := d.Client.Get(ctx, sb.ID()); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get after Kill = %v, want 404", err)
	}
	if left := dirEntries(d.DataDir + "/gvisor/sandboxes"); len(left) > 0 {
		for _, inst := range left {
			if ents := dirEntries(d.DataDir + "/gvisor/sandboxes/" + inst); len(ents) > 0 {
				t.Errorf("gvisor sandbox directories left after Kill: %v", ents)
			}
		}
	}
}

// TestGvisorEgressFenced attacks the network fence from inside a gvisor
// sandbox: with the default (deny-all) policy nothing outside answers, not
// a public address, not the host's own address and the daemon's port, not
// a name; and the daemon's DNS gives no answer for a denied name. The
// sandbox's packets must all go through the daemon's stack, as on native.
func TestGvisorEgressFenced(t *testing.T) {
	testutil.RequireRunsc(t)
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t), "--backend", "gvisor")
	ctx := ctxT(t)
	sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "minimal"})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	defer d.Client.Kill(ctxT(t), sb.ID())
	e := sb.Envd()
	host := strings.TrimPrefix(strings.TrimPrefix(d.URL, "http://"), "https://")
	_, port, _ := strings.Cut(host, ":")
	targets := []string{"1.1.1.1:80", "10.0.2.2:" + port, "169.254.169.254:80"}
	for _, ip := range hostIPv4s(t) {
		targets = append(targets, ip+":"+port)
	}
	for _, target := range targets {
		out := sh(t, e, "nc -w 3 "+strings.Replace(target, ":", " ", 1)+" </dev/null >/dev/null 2>&1 && echo CONNECTED || echo refused")
		if strings.Contains(out, "CONNECTED") {
			t.Errorf("a gvisor sandbox with a deny-all policy connected to %s", target)
		}
	}
	if out := sh(t, e, "nslookup example.com 2>&1 | tail -2; echo done"); strings.Contains(out, "Address: ") && !strings.Contains(out, "10.0.2.3") {
		t.Errorf("a denied name resolved inside the gvisor sandbox: %q", out)
	}
	// The sandbox's view: one interface besides loopback, no route to the
	// host's networks other than through the fence.
	t.Logf("network inside: %s", sh(t, e, "ip addr 2>/dev/null || cat /proc/net/dev"))
}

// TestGvisorSecureSandboxAgent: on a secure gvisor sandbox the daemon
// checks the envd access token as on native (a request without it is
// refused, one with it runs), and no process inside reaches the agent
// past that check (probe agent-reach, run as the template's default user
// and as root).
func TestGvisorSecureSandboxAgent(t *testing.T) {
	testutil.RequireRunsc(t)
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal", Secure: ptr(true), Metadata: gvisorMeta})
	if sb.EnvdAccessToken == "" {
		t.Fatal("the secure sandbox has no envd access token")
	}
	to := map[string]string{api.HeaderSandboxID: sb.ID(), api.HeaderSandboxPort: strconv.Itoa(api.EnvdPort)}
	if r := d.do(t, "GET", "/envs", "", nil, to); r.Status != 401 {
		t.Errorf("GET /envs without the access token = %d %s, want 401", r.Status, r.Body)
	}
	to[api.HeaderAccessToken] = sb.EnvdAccessToken
	if r := d.do(t, "GET", "/envs", "", nil, to); r.Status != 200 {
		t.Errorf("GET /envs with the access token = %d %s, want 200", r.Status, r.Body)
	}
	for _, e := range []*client.Envd{sb.Envd(), sb.Envd().WithUser("root")} {
		if out := sh(t, e, "id -un; /.fence/fence probe agent-reach"); !strings.HasSuffix(out, "\nok\n") {
			t.Errorf("probe agent-reach inside the secure gvisor sandbox: %q", out)
		}
	}
}

// TestGvisorDefaultBuildsTemplates builds a template on a daemon whose
// default backend is gvisor: the build's sandbox reads its layer, which
// native sandboxes give, so it runs on native; a gvisor sandbox then boots
// the built template.
func TestGvisorDefaultBuildsTemplates(t *testing.T) {
	testutil.RequireRunsc(t)
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t), "--backend", "gvisor")
	tid, bid := buildTemplate(t, d, "gv-default", client.TemplateBuildSpec{FromTemplate: "minimal",
		Steps: steps("echo built > /built")})
	st, logs := waitBuild(t, d, tid, bid)
	if st.Status != "ready" {
		t.Fatalf("build on a gvisor daemon: %s (%+v)\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	sb := d.create(t, api.NewSandbox{TemplateID: "gv-default"})
	rc, err := sb.Envd().ReadFile(ctxT(t), "/built")
	if err != nil {
		t.Fatalf("reading /built in a sandbox of the built template: %v", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(got) != "built\n" {
		t.Errorf("/built in a sandbox of the built template = %q, %v; want built", got, err)
	}
}
