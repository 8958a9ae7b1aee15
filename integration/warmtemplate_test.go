package integration

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// TestWarmTemplatePrepared: with --warm-template, sandboxes of a template
// with a start command are started ahead of requests, their start command
// run and their ready command passed. A create hands one out: its start
// command ran before the request, once, with the template's environment,
// and the request's environment is the sandbox's. A template that does not
// exist stops the daemon at start with a clear error.
func TestWarmTemplatePrepared(t *testing.T) {
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t), "--warm-pool", "0")
	tid, bid := buildTemplate(t, d, "warm-start", client.TemplateBuildSpec{FromTemplate: "base",
		Steps:    steps("echo from-template > /opt/marker"),
		StartCmd: "date +%s%N >> /tmp/started; echo \"$WARM_REQ\" > /tmp/start-env; exec sleep infinity", ReadyCmd: "[ -s /tmp/started ]"})
	if st, logs := waitBuild(t, d, tid, bid); st.Status != "ready" {
		t.Fatalf("build %s %+v\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	d.Stop()
	d.extra = append(d.extra, "--warm-template", "warm-start=1")
	d.Restart()
	eventually(t, 2*time.Minute, "a warm-start sandbox is ready in the pool", func() bool {
		return metricValue(t, d, "fence_sandboxes_warm_ready") >= 1
	})
	before := time.Now()
	sb, err := d.Client.Create(ctxT(t), api.NewSandbox{TemplateID: "warm-start", EnvVars: map[string]string{"WARM_REQ": "from-request"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Kill(ctxT(t))
	started := strings.Fields(sh(t, sb.Envd(), "cat /tmp/started"))
	if len(started) != 1 {
		t.Fatalf("start command runs: %q, want exactly one", started)
	}
	ns, err := strconv.ParseInt(started[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if at := time.Unix(0, ns); !at.Before(before) {
		t.Errorf("the start command ran at %s, after the create was asked at %s: not started ahead", at, before)
	}
	if got := sh(t, sb.Envd(), "cat /tmp/start-env"); got != "\n" {
		t.Errorf("the start command saw the request's environment: %q", got)
	}
	if got := sh(t, sb.Envd(), "echo $WARM_REQ; cat /opt/marker"); got != "from-request\nfrom-template\n" {
		t.Errorf("the handed-out sandbox: %q, want the request's environment and the template's files", got)
	}
	if n := strings.TrimSpace(sh(t, sb.Envd(), "pgrep -c -x sleep")); n != "1" {
		t.Errorf("%s start command processes, want 1", n)
	}

	if err := sb.Kill(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	// A template that does not exist: the daemon refuses to start.
	d.Stop()
	d.extra = append(d.extra, "--warm-template", "no-such-template=1")
	_, stderr, code := runFence(t, []string{"FENCE_API_KEY=" + d.Key}, nil, append([]string{"serve", "--addr", "127.0.0.1:0",
		"--data-dir", d.DataDir, "--templates-dir", templatesDir(t)}, d.extra...)...)
	if code == 0 || !strings.Contains(stderr, "no-such-template") {
		t.Errorf("serve with a missing --warm-template: exit %d, stderr %q; want a failure naming it", code, stderr)
	}
}

// metricValue reads an unlabelled metric from the daemon's /metrics (-1
// when absent).
func metricValue(t *testing.T, d *daemon, name string) float64 {
	t.Helper()
	r := d.do(t, "GET", "/metrics", d.Key, nil, nil)
	for _, line := range strings.Split(string(r.Body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
