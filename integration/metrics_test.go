package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
)

// TestSandboxesMetricsRoute proves GET /sandboxes/metrics against a real
// daemon and sandboxes: each named sandbox's latest reading keyed by its
// ID, with the readings' fields (memory and disk limits read from the
// sandbox's cgroup and disk), unknown and killed sandboxes left out, and
// E2B's 400 for a missing or oversized list. Root: namespaces, cgroups.
func TestSandboxesMetricsRoute(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	a := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	b := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	gone := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	if err := d.Client.Kill(ctxT(t), gone.ID()); err != nil {
		t.Fatal(err)
	}
	q := strings.Join([]string{a.ID(), b.ID(), gone.ID(), "nosuchsandbox"}, ",")
	r := d.do(t, "GET", "/sandboxes/metrics?sandbox_ids="+q, d.Key, nil, nil)
	var got api.SandboxesWithMetrics
	if err := json.Unmarshal(r.Body, &got); r.Status != 200 || err != nil {
		t.Fatalf("GET /sandboxes/metrics?sandbox_ids=%s = %d %s, want 200", q, r.Status, r.Body)
	}
	if len(got.Sandboxes) != 2 {
		t.Errorf("GET /sandboxes/metrics?sandbox_ids=%s = %s, want %s and %s only", q, r.Body, a.ID(), b.ID())
	}
	for _, id := range []string{a.ID(), b.ID()} {
		m, ok := got.Sandboxes[id]
		if !ok || m.TimestampUnix == 0 || m.CPUCount <= 0 || m.MemTotal <= 0 || m.MemUsed <= 0 {
			t.Errorf("metrics of %s = %+v (present %v), want a reading with CPUs, memory used and its limit", id, m, ok)
		}
	}
	// A sandbox paused without its memory (nothing of it runs) fails no
	// other's readings.
	if err := d.Client.PauseWithoutMemory(ctxT(t), b.ID()); err != nil {
		t.Fatal(err)
	}
	r = d.do(t, "GET", "/sandboxes/metrics?sandbox_ids="+q, d.Key, nil, nil)
	got = api.SandboxesWithMetrics{}
	if err := json.Unmarshal(r.Body, &got); r.Status != 200 || err != nil || got.Sandboxes[a.ID()].MemTotal <= 0 {
		t.Errorf("GET /sandboxes/metrics?sandbox_ids=%s with %s paused = %d %s, want 200 with %s's reading", q, b.ID(), r.Status, r.Body, a.ID())
	}
	t.Logf("with %s paused without memory: %s", b.ID(), r.Body)
	many := make([]string, 101)
	for i := range many {
		many[i] = fmt.Sprintf("s%d", i)
	}
	for _, tc := range []struct{ query, msg string }{
		{"", "sandbox_ids is required"},
		{"?sandbox_ids=" + strings.Join(many, ","), "Too many sandboxes requested, maximum is 100"},
	} {
		r := d.do(t, "GET", "/sandboxes/metrics"+tc.query, d.Key, nil, nil)
		var e api.Error
		if err := json.Unmarshal(r.Body, &e); r.Status != 400 || err != nil || e.Code != 400 || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("GET /sandboxes/metrics%s = %d %s, want 400 {\"code\":400,\"message\":\"…%s…\"}", tc.query[:min(len(tc.query), 30)], r.Status, r.Body, tc.msg)
		}
	}
}
