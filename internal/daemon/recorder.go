package daemon

import (
	"context"
	"log/slog"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/metrics"
)

// flowRecorder counts every sandbox network flow in the metrics and logs
// it: refused flows at info level (an operator wants to see what was
// blocked), allowed ones at debug. The audit log will take the same
// events through the same interface.
type flowRecorder struct {
	log   *slog.Logger
	flows metrics.Counter
	bytes metrics.Counter
}

func newFlowRecorder(log *slog.Logger, reg *metrics.Registry) *flowRecorder {
	return &flowRecorder{
		log:   log,
		flows: reg.Counter("fence_egress_flows_total", "Sandbox network flows by protocol and decision."),
		bytes: reg.Counter("fence_egress_bytes_total", "Bytes through sandbox network flows, by direction."),
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
	r.log.Log(ctx, level, "network flow", "sandbox_id", ev.SandboxID, "proto", ev.Proto,
		"dst", ev.Dst.String(), "name", ev.Name, "observed", ev.Observed, "decision", decision,
		"reason", ev.Reason, "bytes_out", ev.BytesOut, "bytes_in", ev.BytesIn, "duration", ev.Duration)
}
