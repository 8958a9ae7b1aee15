package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// counterFromHost reads the counter file of a sandbox from the host,
// through /proc/PID/root of one of its processes: it works while the
// sandbox is frozen, when nothing inside could answer. It is -1 before the
// loop first wrote it.
func counterFromHost(t *testing.T, id string) int {
	t.Helper()
	n, ok := readCounterFromHost(t, id)
	if !ok {
		t.Fatalf("no process of sandbox %s shows /tmp/c", id)
	}
	return n
}

func readCounterFromHost(t *testing.T, id string) (int, bool) {
	t.Helper()
	for _, p := range sandboxProcs(t, id) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/tmp/c", p.PID))
		if err != nil {
			continue
		}
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return n, true
		}
	}
	return -1, false
}

// TestPauseResume proves pause and resume through the real daemon: a
// counting loop stops while the sandbox is paused and continues after the
// resume, files are kept, the envd token is the same, sandbox traffic gets
// the 502 while paused, and a kill of a paused sandbox leaves nothing
// behind. Root: the daemon creates namespaces, cgroups and mounts.
func TestPauseResume(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	other := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	e := sb.Envd()
	sh(t, e, `echo kept > /tmp/file; (i=0; while :; do i=$((i+1)); echo $i > /tmp/c.n && mv -f /tmp/c.n /tmp/c; sleep 0.1; done) </dev/null >/dev/null 2>&1 &`)
	eventually(t, 30*time.Second, "the counter to count", func() bool {
		n, _ := readCounterFromHost(t, sb.ID())
		return n > 2
	})

	if err := d.Client.Pause(ctx, sb.ID()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	c1 := counterFromHost(t, sb.ID())
	time.Sleep(2 * time.Second)
	c2 := counterFromHost(t, sb.ID())
	if c2 != c1 {
		t.Errorf("the counter went from %d to %d while the sandbox was paused", c1, c2)
	}
	if err := d.Client.Pause(ctx, sb.ID()); !errors.Is(err, api.ErrConflict) {
		t.Errorf("second Pause = %v, want 409", err)
	}
	info, err := d.Client.Get(ctx, sb.ID())
	if err != nil || info.State != "paused" || info.EnvdAccessToken != sb.EnvdAccessToken {
		t.Errorf("Get(paused) = %+v, %v; want paused with the same token", info, err)
	}
	list, err := d.Client.List(ctx, client.ListOptions{State: []string{"paused"}})
	if ids := listedIDs(list); err != nil || !slices.Equal(ids, []string{sb.ID()}) {
		t.Errorf("List(paused) = %q, %v; want [%s]", ids, err, sb.ID())
	}
	// Sandbox traffic: the proxy's 502, on the agent and on another port,
	// at once (a frozen agent would otherwise hang the request).
	for _, port := range []string{"49983", "8000"} {
		r := d.do(t, "GET", "/health", "", nil, map[string]string{
			api.HeaderSandboxID: sb.ID(), api.HeaderSandboxPort: port, api.HeaderAccessToken: sb.EnvdAccessToken})
		var pe api.ProxyError
		if json.Unmarshal(r.Body, &pe); r.Status != 502 || pe.Code != 502 || pe.SandboxID != sb.ID() {
			t.Errorf("GET /health on port %s of the paused sandbox = %d %s, want the 502", port, r.Status, r.Body)
		}
	}
	if _, err := e.Stat(ctx, "/tmp/file"); err == nil {
		t.Errorf("envd of the paused sandbox answered")
	}
	// The other sandbox runs on.
	sh(t, other.Envd(), "true")

	// Resume through connect: the same ID and token, the loop continues.
	start := time.Now()
	resumed, err := d.Client.Connect(ctx, sb.ID(), time.Minute)
	if err != nil {
		t.Fatalf("Connect (resume): %v", err)
	}
	t.Logf("resume through connect took %v", time.Since(start))
	if resumed.ID() != sb.ID() || resumed.EnvdAccessToken != sb.EnvdAccessToken {
		t.Errorf("Connect = %+v, want the same ID and envd token", resumed.Sandbox)
	}
	if got := sh(t, e, "cat /tmp/file"); got != "kept\n" {
		t.Errorf("/tmp/file after resume = %q", got)
	}
	eventually(t, 30*time.Second, "the counter to continue", func() bool { return counterFromHost(t, sb.ID()) > c2 })
	if c3 := counterFromHost(t, sb.ID()); c3 < c2 {
		t.Errorf("the counter restarted: %d after %d", c3, c2)
	}
	info, err = d.Client.Get(ctx, sb.ID())
	if err != nil || info.State != "running" {
		t.Errorf("Get(resumed) = %+v, %v; want running", info, err)
	}

	// Kill while paused: no process, cgroup, mount or directory is left.
	if err := d.Client.Pause(ctx, sb.ID()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	procs := sandboxProcs(t, sb.ID())
	if len(procs) == 0 {
		t.Fatalf("no processes found for the paused sandbox")
	}
	if err := d.Client.Kill(ctx, sb.ID()); err != nil {
		t.Fatalf("Kill(paused): %v", err)
	}
	if live := alive(procs); len(live) > 0 {
		t.Errorf("processes of the killed paused sandbox still run: %v", live)
	}
	if _, err := d.Client.Get(ctx, sb.ID()); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get after Kill = %v, want 404", err)
	}
	assertNoSandboxLeftovers(t, d.DataDir, map[string]bool{sb.ID(): true}, map[string]bool{other.ID(): true})
}

// TestPausedDoesNotSurviveRestart: a daemon killed while a sandbox is
// paused leaves a frozen sandbox behind; the next start removes it and its
// record says killed, not running or paused.
func TestPausedDoesNotSurviveRestart(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	// Not d.create: its cleanup would use the first daemon's address.
	sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "minimal"})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := d.Client.Pause(ctx, sb.ID()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	procs := sandboxProcs(t, sb.ID())
	if len(procs) == 0 {
		t.Fatalf("no processes found for the paused sandbox")
	}
	d.Crash()
	d.Restart()
	if live := alive(procs); len(live) > 0 {
		t.Errorf("processes of the paused sandbox still run after restart: %v", live)
	}
	if _, err := d.Client.Get(ctx, sb.ID()); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get(%s) after restart = %v, want 404", sb.ID(), err)
	}
	list, err := d.Client.List(ctx, client.ListOptions{State: []string{"running", "paused"}})
	if err != nil || len(list) != 0 {
		t.Errorf("List after restart = %q, %v; want none", listedIDs(list), err)
	}
	if _, err := d.Client.Connect(ctx, sb.ID(), time.Minute); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Connect after restart = %v, want 404", err)
	}
	assertNoSandboxLeftovers(t, d.DataDir, map[string]bool{sb.ID(): true}, nil)
}
