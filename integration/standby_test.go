package integration

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// standbyKeys counts the native host resources (cgroups) named after id:
// the sandbox's, and its standby's once one boots.
func standbyKeys(d *daemon, id string) int {
	keys := map[string]bool{}
	for _, cg := range sandboxCgroups(instanceOf(d.DataDir)) {
		if n := filepath.Base(cg); keyID(n) == id {
			keys[n] = true
		}
	}
	return len(keys)
}

// A rewind to a sandbox's last checkpoint hands over the standby the
// daemon booted on it: the sandbox is the checkpoint's (files), with its
// environment, hostname and token; what ran after the checkpoint is gone;
// the network is the one in force now (opened after the checkpoint, while
// the standby waited with none); a second rewind finds a new standby; a
// pause drops it; and a kill leaves nothing of either (the daemon's stop
// checks too).
func TestRewindHandsOverStandby(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t)
	x := &netEnv{fn: fn, canary: newCanary(t)}
	d := startDaemon(t, newDataDir(t), "--dns-upstream", fn.DNS.Addr)
	x.d = d
	sb := d.create(t, api.NewSandbox{TemplateID: "base", EnvVars: map[string]string{"FOO": "bar"}, AllowInternetAccess: ptr(false)})
	e := sb.Envd()
	rsh(t, e, `echo one > /a`)
	cp, err := d.Client.Checkpoint(t.Context(), sb.ID(), "")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a standby of "+sb.ID(), func() bool { return standbyKeys(d, sb.ID()) == 2 })
	r := d.do(t, "PUT", "/sandboxes/"+sb.ID()+"/network", d.Key, strings.NewReader(`{"denyOut":["0.0.0.0/0"],"allowOut":["`+wanIP+`"]}`), nil)
	if r.Status != http.StatusNoContent {
		t.Fatalf("PUT network = %d %s", r.Status, r.Body)
	}
	for i := range 2 {
		rsh(t, e, `echo two > /a; (sleep 1001 </dev/null >/dev/null 2>&1 &)`)
		handed := strings.Count(d.out.String(), "standby=true")
		if err := d.Client.Rewind(t.Context(), sb.ID(), cp.CheckpointID); err != nil {
			t.Fatalf("rewind %d: %v", i, err)
		}
		eventually(t, 10*time.Second, "the hand-over logged", func() bool {
			return strings.Count(d.out.String(), "standby=true") == handed+1
		})
		got := rsh(t, e, `cat /a; echo $FOO; hostname; pgrep -f "slee[p] 1001" || echo none`)
		if want := "one\nbar\n" + sb.ID() + "\nnone\n"; got != want {
			t.Errorf("after rewind %d: %q, want %q", i, got, want)
		}
		x.reached(t, e, curl+"http://"+wanIP+"/standby", "path=/standby")
		x.refused(t, e, curl+"http://"+evilIP+"/standby", noPackets)
		eventually(t, 30*time.Second, "a new standby of "+sb.ID(), func() bool { return standbyKeys(d, sb.ID()) == 2 })
	}
	// A pause drops the standby; a checkpoint after the resume makes one.
	if err := d.Client.Pause(t.Context(), sb.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the standby of the paused "+sb.ID()+" gone", func() bool { return standbyKeys(d, sb.ID()) == 1 })
	if _, err := d.Client.Connect(t.Context(), sb.ID(), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.Checkpoint(t.Context(), sb.ID(), ""); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a standby after the resume", func() bool { return standbyKeys(d, sb.ID()) == 2 })
	if err := d.Client.Kill(t.Context(), sb.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the cgroups of "+sb.ID()+" and its standby gone", func() bool { return standbyKeys(d, sb.ID()) == 0 })
}
