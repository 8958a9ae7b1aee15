package daemon

import (
	"context"
	"log/slog"
	"sync/atomic"

	"golang.org/x/time/rate"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/metrics"
)

// flowRecorder counts every sandbox network flow in the metrics and logs
// it: refused flows at info level (an operator wants to see what was
// blocked), allowed ones at debug. Info lines are rate-limited, so a
// sandbox flooding refused connections or DNS queries cannot flood the
// host's log; what is dropped is counted. The audit log will take the
// same events through the same interface.
type flowRecorder struct {
	log        *slog.Logger
	flows      metrics.Counter
	bytes      metrics.Counter
	limit      *rate.Limiter
	suppressed atomic.Int64
}

func newFlowRecorder(log *slog.Logger, reg *metrics.Registry) *flowRecorder {
	return &flowRecorder{
		log:   log,
		flows: reg.Counter("fence_egress_flows_total", "Sandbox network flows by protocol and decision."),
		bytes: reg.Counter("fence_egress_bytes_total", "Bytes through sandbox network flows, by direction."),
		limit: rate.NewLimiter(50, 100),
	}
}

// Record implements egress.Recorder.
func (r *flowRecorder) Record(ctx context.Context, ev egress.FlowEvent) {
	decision := "deny"
	level := slog.LevelInfo
	if ev.Allowed {
		decision, level = "allow", slog.LevelDebug
	}
	r.flows.Add(1, "proto", ev.Proto, "decision", decision)
	r.bytes.Add(ev.BytesOut, "direction", "out")
	r.bytes.Add(ev.BytesIn, "direction", "in")
	if !r.log.Enabled(ctx, level) {
		return
	}
	if level >= slog.LevelInfo && !r.limit.Allow() {
		r.suppressed.Add(1)
		return
	}
	attrs := []any{"sandbox_id", ev.SandboxID, "proto", ev.Proto,
		"dst", ev.Dst.String(), "name", ev.Name, "observed", ev.Observed, "decision", decision,
		"reason", ev.Reason, "bytes_out", ev.BytesOut, "bytes_in", ev.BytesIn, "duration", ev.Duration}
	if n := r.suppressed.Swap(0); n > 0 {
		attrs = append(attrs, "suppressed_before", n)
	}
	r.log.Log(ctx, level, "network flow", attrs...)
}
