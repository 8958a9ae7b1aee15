package integration

import (
	"context"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/testutil"
)

// bootIDForm is how Linux (and gVisor) write a boot ID: a random UUID.
var bootIDForm = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n$`)

// TestBootIDPerBoot proves that /proc/sys/kernel/random/boot_id tells
// the boots of sandboxes apart, as it tells a machine's: two sandboxes
// read different IDs, neither the host's; a pause that keeps the memory
// keeps the ID; the resume of a filesystem-only pause is a reboot and
// reads a new one (and, on native, so does a fork). On native and on
// gvisor. Root: namespaces, cgroups (and runsc).
func TestBootIDPerBoot(t *testing.T) {
	t.Run("native", func(t *testing.T) { testBootIDPerBoot(t, "minimal", nil) })
	t.Run("gvisor", func(t *testing.T) {
		testutil.RequireRunsc(t)
		testBootIDPerBoot(t, "base", gvisorMeta)
	})
}

func testBootIDPerBoot(t *testing.T, tmpl string, meta map[string]string) {
	requireTemplate(t, tmpl)
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)
	host, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	bootID := func(e *client.Envd, what string) string {
		t.Helper()
		id := rsh(t, e, "cat /proc/sys/kernel/random/boot_id")
		if !bootIDForm.MatchString(id) {
			t.Errorf("boot_id %s = %q, want a random UUID and a newline", what, id)
		}
		if id == string(host) {
			t.Errorf("boot_id %s = %q, the host's", what, id)
		}
		return id
	}
	a := d.create(t, api.NewSandbox{TemplateID: tmpl, Metadata: meta})
	b := d.create(t, api.NewSandbox{TemplateID: tmpl, Metadata: meta})
	idA, idB := bootID(a.Envd(), "of a"), bootID(b.Envd(), "of b")
	if idA == idB {
		t.Errorf("two sandboxes read the same boot_id %q", idA)
	}

	if err := d.Client.Pause(ctx, a.ID()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	resumed, err := d.Client.Connect(ctx, a.ID(), 5*time.Minute)
	if err != nil {
		t.Fatalf("Connect after a pause with memory: %v", err)
	}
	if got := bootID(resumed.Envd(), "after a pause with memory"); got != idA {
		t.Errorf("boot_id after a pause that kept the memory = %q, want %q (no reboot)", got, idA)
	}

	if err := d.Client.PauseWithoutMemory(ctx, a.ID()); err != nil {
		t.Fatalf("PauseWithoutMemory: %v", err)
	}
	resumed, err = d.Client.Connect(ctx, a.ID(), 5*time.Minute)
	if err != nil {
		t.Fatalf("Connect after a pause without memory: %v", err)
	}
	rebooted := bootID(resumed.Envd(), "after a pause without memory")
	if rebooted == idA || rebooted == idB {
		t.Errorf("boot_id after the resume of a pause without memory = %q, the same as before (%q) or b's (%q)", rebooted, idA, idB)
	}

	if meta != nil {
		return // gvisor forks keep the parent's memory: the same boot
	}
	forks, errs, err := d.Client.Fork(ctx, b.ID(), 1, time.Minute)
	if err != nil || len(forks) != 1 || errs[0] != nil {
		t.Fatalf("Fork: %v, %v", errs, err)
	}
	t.Cleanup(func() { d.Client.Kill(context.Background(), forks[0].ID()) })
	if got := bootID(forks[0].Envd(), "of a fork"); got == idB || got == idA || got == rebooted {
		t.Errorf("boot_id of a fork of b = %q, not a boot of its own", got)
	}
}
