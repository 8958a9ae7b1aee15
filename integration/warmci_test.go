package integration

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// serverStartScript prints when the sandbox's code-interpreter server
// started, in hundredths of a second since the epoch, and whether a
// kernel runs.
const serverStartScript = `pid=$(pgrep -f code-interpreter/server.py | head -1)
st=$(cut -d' ' -f22 /proc/$pid/stat); bt=$(awk '/^btime/ {print $2}' /proc/stat)
echo $((bt * 100 + st)); pgrep -f ipykernel >/dev/null && echo kernel`

// TestCodeInterpreterPool: --warm-code-interpreter keeps code-interpreter
// sandboxes started ahead, their kernel running: a create that adds no env
// vars (the SDK's Sandbox.create(), by its alias) is handed one whose
// server and kernel started before the request; a create with env vars of
// its own gets a sandbox of its own, whose server sees them.
func TestCodeInterpreterPool(t *testing.T) {
	requireTemplate(t, "code-interpreter")
	d := startDaemon(t, newDataDir(t), "--warm-code-interpreter", "1")
	eventually(t, 3*time.Minute, "a code-interpreter sandbox is ready in the pool", func() bool {
		return metricValue(t, d, "fence_sandboxes_warm_ready") >= 1
	})
	started := func(out string) (time.Time, bool) {
		f := strings.Fields(out)
		if len(f) == 0 {
			t.Fatalf("server start: %q", out)
		}
		cs, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return time.UnixMilli(cs * 10), len(f) > 1 && f[1] == "kernel"
	}

	before := time.Now()
	sb := d.create(t, api.NewSandbox{TemplateID: "code-interpreter-v1"})
	at, kernel := started(sh(t, sb.Envd(), serverStartScript))
	if !at.Before(before.Add(-time.Second)) || !kernel {
		t.Errorf("sandbox handed out: server started at %s, the create asked at %s, kernel running %v; want a pooled one with its kernel",
			at, before, kernel)
	}

	before = time.Now()
	own := d.create(t, api.NewSandbox{TemplateID: "code-interpreter-v1", EnvVars: map[string]string{"CI_ENV": "mine"}})
	out := sh(t, own.Envd(), serverStartScript)
	if at, _ := started(out); at.Before(before.Add(-time.Second)) {
		t.Errorf("a create with env vars was handed a sandbox whose server started at %s, before the create at %s", at, before)
	}
	if got := sh(t, own.Envd(), `tr '\0' '\n' < /proc/$(pgrep -f code-interpreter/server.py | head -1)/environ | grep ^CI_ENV=`); got != "CI_ENV=mine\n" {
		t.Errorf("the server of a create with env vars sees %q", got)
	}
}
