package integration

import (
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestGvisorRunImage: on the gvisor backend, the first sandbox of a
// template with a start command is checkpointed once its ready command
// passed, and the next sandbox of the template, made the same way,
// restores that run image: its start command's process runs, and it ran
// once, in the first sandbox, before the image was taken. Root:
// namespaces, cgroups, runsc.
func TestGvisorRunImage(t *testing.T) {
	testutil.RequireRunsc(t)
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t), "--warm-pool", "0")
	tid, bid := buildTemplate(t, d, "run-image", client.TemplateBuildSpec{FromTemplate: "base",
		Steps:    steps("echo from-template > /opt/marker"),
		StartCmd: "date +%s%N >> /tmp/started; exec sleep infinity", ReadyCmd: "[ -s /tmp/started ]"})
	if st, logs := waitBuild(t, d, tid, bid); st.Status != "ready" {
		t.Fatalf("build %s %+v\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	ctx := ctxT(t)
	started := func(sb *client.Sandbox) []string {
		t.Helper()
		return strings.Fields(sh(t, sb.Envd(), "cat /tmp/started"))
	}
	first, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "run-image", Metadata: gvisorMeta})
	if err != nil {
		t.Fatalf("Create(first): %v", err)
	}
	defer first.Kill(ctxT(t))
	ran := started(first)
	if len(ran) != 1 {
		t.Fatalf("first sandbox: start command runs %q, want exactly one", ran)
	}
	second, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "run-image", Metadata: gvisorMeta})
	if err != nil {
		t.Fatalf("Create(second): %v", err)
	}
	defer second.Kill(ctxT(t))
	if got := started(second); len(got) != 1 || got[0] != ran[0] {
		t.Errorf("second sandbox: start command runs %q, want the first's %q alone (restored from its run image)", got, ran)
	}
	if n := strings.TrimSpace(sh(t, second.Envd(), "pgrep -c -x sleep")); n != "1" {
		t.Errorf("second sandbox: %s start command processes, want 1", n)
	}
	if got := sh(t, second.Envd(), "cat /opt/marker"); got != "from-template\n" {
		t.Errorf("second sandbox: /opt/marker = %q, want the template's", got)
	}
}
