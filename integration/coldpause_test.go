package integration

import (
	"context"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestPauseWithoutMemorySurvivesRestart: a sandbox paused without memory
// outlives its daemon, a kill -9 and a graceful stop alike: after the
// restart it is listed paused, and connect boots it on its kept files
// with the same token, environment, secret placeholder, metadata,
// network, template and lifecycle (its deadline pauses it without memory
// again). Its kill then removes its layer and everything else. On native
// and on gvisor. Root: namespaces, cgroups (and runsc).
func TestPauseWithoutMemorySurvivesRestart(t *testing.T) {
	t.Run("native", func(t *testing.T) { testColdPauseRestart(t, "minimal", nil) })
	t.Run("gvisor", func(t *testing.T) {
		testutil.RequireRunsc(t)
		testColdPauseRestart(t, "base", gvisorMeta)
	})
}

func testColdPauseRestart(t *testing.T, tmpl string, meta map[string]string) {
	requireTemplate(t, tmpl)
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	if _, err := d.Client.CreateSecret(ctx, "cold-token", "s3cret-value", nil); err != nil {
		t.Fatal(err)
	}
	noInternet, yes, no := false, true, false
	timeout := int32(600)
	md := map[string]string{"k": "v"}
	maps.Copy(md, meta)
	// Not d.create: its cleanup would use the first daemon's address.
	sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: tmpl, Metadata: md, EnvVars: map[string]string{"E": "env"},
		Timeout: &timeout, AutoPause: &yes, AutoPauseMemory: &no, AllowInternetAccess: &noInternet,
		Network: &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"api.example.com"}},
		Secrets: map[string]api.SecretBinding{"TOKEN": {Secret: "cold-token", Hosts: []string{"api.example.com"}}}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { d.Client.Kill(context.Background(), sb.ID()) })
	e := sb.Envd()
	placeholder := rsh(t, e, `echo $TOKEN`)
	if strings.Contains(placeholder, "s3cret") || len(strings.TrimSpace(placeholder)) < 10 {
		t.Fatalf("TOKEN in the sandbox: %q", placeholder)
	}
	before, err := d.Client.Get(ctx, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	rsh(t, e, `mkdir -p /work && echo kept > /work/a && (sleep 3003 </dev/null >/dev/null 2>&1 &)`)

	for _, restart := range []string{"kill -9", "SIGTERM"} {
		if err := d.Client.PauseWithoutMemory(ctx, sb.ID()); err != nil {
			t.Fatalf("PauseWithoutMemory: %v", err)
		}
		if restart == "kill -9" {
			d.Crash()
		} else {
			d.Stop()
		}
		d.Restart()
		list, err := d.Client.List(ctx, client.ListOptions{State: []string{"paused"}})
		if err != nil || !slices.ContainsFunc(list, func(s api.ListedSandbox) bool { return s.SandboxID == sb.ID() && s.State == "paused" }) {
			t.Fatalf("after %s and a restart, paused sandboxes: %+v, %v; want %s", restart, list, err, sb.ID())
		}
		info, err := d.Client.Get(ctx, sb.ID())
		if err != nil || info.State != "paused" || info.EnvdAccessToken != sb.EnvdAccessToken || info.TemplateID != before.TemplateID ||
			!reflect.DeepEqual(info.Metadata, before.Metadata) || !reflect.DeepEqual(info.Network, before.Network) ||
			!reflect.DeepEqual(info.AllowInternetAccess, before.AllowInternetAccess) || !reflect.DeepEqual(info.Lifecycle, before.Lifecycle) {
			t.Fatalf("after %s and a restart: %+v, %v; before %+v", restart, info, err, before)
		}
		start := time.Now()
		resumed, err := d.Client.Connect(ctx, sb.ID(), 5*time.Minute)
		if err != nil {
			t.Fatalf("Connect after %s and a restart: %v", restart, err)
		}
		t.Logf("cold resume after %s and a restart took %v", restart, time.Since(start))
		if resumed.EnvdAccessToken != sb.EnvdAccessToken {
			t.Errorf("token changed over the restart")
		}
		e = resumed.Envd() // the new daemon's address
		got := rsh(t, e, `cat /work/a; echo $E; echo $TOKEN; ps -eo args | grep -c '[s]leep 3003' || true`)
		if want := "kept\nenv\n" + placeholder + "0\n"; got != want {
			t.Errorf("after %s, a restart and connect: %q, want %q (files, env and placeholder kept, no process of before)", restart, got, want)
		}
		if info, err := d.Client.Get(ctx, sb.ID()); err != nil || info.State != "running" || !reflect.DeepEqual(info.Network, before.Network) {
			t.Errorf("after connect: %+v, %v", info, err)
		}
	}
	// Its lifecycle is kept: at its deadline it pauses without memory.
	if err := d.Client.SetTimeout(ctx, sb.ID(), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the deadline to pause it", func() bool {
		info, err := d.Client.Get(ctx, sb.ID())
		return err == nil && info.State == "paused"
	})
	if _, err := d.Client.Connect(ctx, sb.ID(), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := rsh(t, e, `cat /work/a`); got != "kept\n" {
		t.Errorf("after the auto-pause: %q", got)
	}
	// Paused again, through a crash; its kill then leaves nothing.
	if err := d.Client.PauseWithoutMemory(ctx, sb.ID()); err != nil {
		t.Fatal(err)
	}
	d.Crash()
	d.Restart()
	if err := d.Client.Kill(ctx, sb.ID()); err != nil {
		t.Fatalf("Kill of the paused sandbox after a restart: %v", err)
	}
	if _, err := d.Client.Get(ctx, sb.ID()); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get after the kill: %v, want not found", err)
	}
	eventually(t, 15*time.Second, "no layer left", func() bool {
		c, tmp := layerDirs(d.DataDir)
		gc, gtmp := gvisorLayerDirs(d.DataDir)
		return len(c)+len(tmp)+len(gc)+len(gtmp) == 0
	})
	if meta == nil { // (the gvisor backend's own mounts live under the data dir)
		assertNoSandboxLeftovers(t, d.DataDir, d.sandboxIDs(), nil)
	}
}

// TestGvisorPauseRestartKeepsConfiguration: a gvisor sandbox paused with
// its memory and adopted by the next daemon after a kill -9 keeps what
// its pause recorded beyond its record: its traffic token (its ports stay
// closed to requests without it), lifecycle, secret placeholder binding,
// and its spec (a rewind to a checkpoint taken before the pause boots).
// Root: namespaces, cgroups, runsc.
func TestGvisorPauseRestartKeepsConfiguration(t *testing.T) {
	testutil.RequireRunsc(t)
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	if _, err := d.Client.CreateSecret(ctx, "gv-token", "s3cret-value", nil); err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "base", Metadata: gvisorMeta, EnvVars: map[string]string{"E": "env"},
		AutoPause: &yes, Network: &api.NetworkConfig{AllowPublicTraffic: &no},
		Secrets: map[string]api.SecretBinding{"TOKEN": {Secret: "gv-token", Hosts: []string{"api.example.com"}}}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { d.Client.Kill(context.Background(), sb.ID()) })
	if sb.TrafficAccessToken == nil || *sb.TrafficAccessToken == "" {
		t.Fatalf("no traffic token: %+v", sb.Sandbox)
	}
	e := sb.Envd()
	placeholder := rsh(t, e, `echo $TOKEN`)
	rsh(t, e, `mkdir -p /tmp/www && echo before > /tmp/www/index.html`)
	cp, err := d.Client.Checkpoint(ctx, sb.ID(), "before")
	if err != nil {
		t.Fatal(err)
	}
	rsh(t, e, `echo after > /tmp/www/index.html && cd /tmp/www && (python3 -m http.server 8000 </dev/null >/dev/null 2>&1 &)`)
	port := func(tok string) rawResponse {
		h := map[string]string{api.HeaderSandboxID: sb.ID(), api.HeaderSandboxPort: "8000"}
		if tok != "" {
			h[api.HeaderTrafficToken] = tok
		}
		return d.do(t, "GET", "/", "", nil, h)
	}
	eventually(t, 30*time.Second, "the server to serve", func() bool { return port(*sb.TrafficAccessToken).Status == 200 })
	before, err := d.Client.Get(ctx, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Client.Pause(ctx, sb.ID()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	d.Crash()
	d.Restart()
	info, err := d.Client.Get(ctx, sb.ID())
	if err != nil || info.State != "paused" || !reflect.DeepEqual(info.Lifecycle, before.Lifecycle) {
		t.Fatalf("after the restart: %+v, %v; lifecycle before %+v", info, err, before.Lifecycle)
	}
	resumed, err := d.Client.Connect(ctx, sb.ID(), 5*time.Minute)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	if resumed.TrafficAccessToken == nil || *resumed.TrafficAccessToken != *sb.TrafficAccessToken {
		t.Errorf("traffic token after the restart: %v, want the create's", resumed.TrafficAccessToken)
	}
	if r := port(""); r.Status == 200 {
		t.Errorf("a port of the sandbox answers without its traffic token after the restart: %d %q", r.Status, r.Body)
	}
	if r := port(*sb.TrafficAccessToken); r.Status != 200 || string(r.Body) != "after\n" {
		t.Errorf("GET with the traffic token after the restart: %d %q", r.Status, r.Body)
	}
	e = resumed.Envd()
	if got := rsh(t, e, `echo $E; echo $TOKEN`); got != "env\n"+placeholder {
		t.Errorf("env after the restart: %q", got)
	}
	if err := d.Client.Rewind(ctx, sb.ID(), cp.CheckpointID); err != nil {
		t.Fatalf("Rewind after the restart: %v", err)
	}
	if got := rsh(t, e, `cat /tmp/www/index.html; echo $TOKEN`); got != "before\n"+placeholder {
		t.Errorf("after the rewind: %q", got)
	}
}
