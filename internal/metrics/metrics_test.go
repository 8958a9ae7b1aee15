package metrics

import (
	"strings"
	"sync"
	"testing"
)

func TestExposition(t *testing.T) {
	r := New()
	c := r.Counter("fence_flows_total", "Network flows.")
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { c.Add(1, "proto", "tcp", "decision", "allow") })
	}
	wg.Wait()
	c.Add(2, "proto", "udp", "decision", `de"ny`)
	r.GaugeFunc("fence_sandboxes_running", "Running sandboxes.", func() int64 { return 7 })
	r.CounterFunc("fence_refused_total", "Refused.", func() int64 { return 3 })
	var b strings.Builder
	r.WriteTo(&b)
	want := `# HELP fence_flows_total Network flows.
# TYPE fence_flows_total counter
fence_flows_total{proto="tcp",decision="allow"} 50
fence_flows_total{proto="udp",decision="de\"ny"} 2
# HELP fence_refused_total Refused.
# TYPE fence_refused_total counter
fence_refused_total 3
# HELP fence_sandboxes_running Running sandboxes.
# TYPE fence_sandboxes_running gauge
fence_sandboxes_running 7
`
	if got := b.String(); got != want {
		t.Errorf("WriteTo() =\n%s\nwant\n%s", got, want)
	}
}
