package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// TestAuditOverhead measures (and logs, never asserts) the latency of
// `run true` through the API with the audit trail on and off
// (fence serve --audit=false), interleaved in one run so both see the
// same load, and the records per second the trail took meanwhile.
func TestAuditOverhead(t *testing.T) {
	on := startDaemon(t, newDataDir(t))
	off := startDaemon(t, newDataDir(t), "--audit=false")
	type side struct {
		name string
		d    *daemon
		e    *client.Envd
		lat  []time.Duration
	}
	sides := []*side{{name: "audit on", d: on}, {name: "audit off", d: off}}
	for _, s := range sides {
		s.e = s.d.create(t, api.NewSandbox{TemplateID: "minimal"}).Envd().WithUser("root")
		for range 5 { // warm up
			run(t, s.e, client.ProcessSpec{Cmd: "true"})
		}
	}
	count := func() int {
		out, _, code := runFence(t, nil, nil, "audit", "export", "--data-dir", on.DataDir)
		if code != 0 {
			t.Fatalf("fence audit export failed")
		}
		return strings.Count(out, "\n")
	}
	before := count()
	const n = 200
	start := time.Now()
	var onTime time.Duration
	for i := range 2 * n {
		s := sides[i%2]
		t0 := time.Now()
		if _, _, st := run(t, s.e, client.ProcessSpec{Cmd: "true"}); st.ExitCode != 0 {
			t.Fatalf("%s: true exited %d", s.name, st.ExitCode)
		}
		d := time.Since(t0)
		s.lat = append(s.lat, d)
		if s.d == on {
			onTime += d
		}
	}
	elapsed := time.Since(start)
	time.Sleep(6 * time.Second) // a checkpoint's worth: what was queued is committed
	records := count() - before
	if out, _, _ := runFence(t, nil, nil, "audit", "export", "--data-dir", off.DataDir, "--type", "process.start,process.end,sandbox.create"); strings.TrimSpace(out) != "" {
		t.Errorf("the daemon with --audit=false recorded:\n%s", out)
	}
	p := func(l []time.Duration, q float64) time.Duration {
		c := slices.Clone(l)
		slices.Sort(c)
		return c[int(q*float64(len(c)-1))]
	}
	onP50, offP50 := p(sides[0].lat, 0.5), p(sides[1].lat, 0.5)
	t.Logf("run true through the API, %d each, interleaved over %v:", n, elapsed.Round(time.Millisecond))
	for _, s := range sides {
		t.Logf("  %-9s p50 %v  p90 %v", s.name, p(s.lat, 0.5).Round(time.Microsecond), p(s.lat, 0.9).Round(time.Microsecond))
	}
	t.Logf("  overhead of the audit trail at p50: %+.1f%% (on/off = %.3f)", 100*(float64(onP50)/float64(offP50)-1), float64(onP50)/float64(offP50))
	t.Logf("  records committed: %d (%.1f per run true, %s while its commands ran)", records, float64(records)/n,
		fmt.Sprintf("%.0f records/s", float64(records)/onTime.Seconds()))
}
