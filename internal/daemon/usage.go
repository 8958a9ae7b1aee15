package daemon

import (
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/forensics"
	"github.com/fencesandbox/fence/internal/httpapi"
	"github.com/fencesandbox/fence/internal/metrics"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/export"
)

// layerArchive is a as the exporter takes it: nil (not a typed nil) when
// no layer is kept.
func layerArchive(a *forensics.Archive) export.LayerArchive {
	if a == nil {
		return nil
	}
	return a
}

// registerUsageMetrics serves the usage counters per API key (never per
// sandbox: the label set stays as small as the set of keys).
func registerUsageMetrics(reg *metrics.Registry, mgr *sandbox.Manager) {
	reg.CounterVecFunc("fence_usage_cpu_seconds_total", "CPU time used by sandboxes, per API key that created them.", func() []metrics.Value {
		var out []metrics.Value
		for _, k := range mgr.Meter().Counters() {
			out = append(out, metrics.Value{Labels: []string{"key", k.Actor}, V: k.CPUSeconds})
		}
		return out
	})
	reg.CounterVecFunc("fence_usage_memory_gib_seconds_total", "Memory used by sandboxes integrated over time (GiB-seconds), per API key.", func() []metrics.Value {
		var out []metrics.Value
		for _, k := range mgr.Meter().Counters() {
			out = append(out, metrics.Value{Labels: []string{"key", k.Actor}, V: k.MemoryGiBSeconds})
		}
		return out
	})
	reg.CounterVecFunc("fence_usage_egress_bytes_total", "Bytes of sandboxes' ended network flows, per API key and direction.", func() []metrics.Value {
		var out []metrics.Value
		for _, k := range mgr.Meter().Counters() {
			out = append(out,
				metrics.Value{Labels: []string{"key", k.Actor, "direction", "out"}, V: float64(k.EgressBytesOut)},
				metrics.Value{Labels: []string{"key", k.Actor, "direction", "in"}, V: float64(k.EgressBytesIn)})
		}
		return out
	})
}

// sourcesOf are the audit trail as each event source takes it.
type sourcesOf struct {
	sink    audit.Sink
	log     httpapi.AuditLog
	outputs httpapi.OutputKeeper
}

// auditSources gives the sources l, or nothing when off (fence serve
// --audit=false, only to measure what the trail costs).
func auditSources(l *audit.Log, off bool) sourcesOf {
	if off {
		return sourcesOf{}
	}
	return sourcesOf{sink: l, log: l, outputs: auditOutputs{l}}
}
