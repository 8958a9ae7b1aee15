package daemon

import (
	"context"
	"log/slog"
	"sync"

	"golang.org/x/time/rate"

	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/metrics"
)

// Rates of refused-flow log lines: each sandbox has its own allowance, so
// a sandbox flooding refused connections or DNS queries cannot hide
// another's, and all of them together have a daemon-wide cap.
const (
	sandboxLogRate  = 5 // lines per second per sandbox (burst: sandboxLogBurst)
	sandboxLogBurst = 20
	globalLogRate   = 200 // lines per second for the daemon (burst: twice)
	maxLogLimiters  = 4096
)

// flowRecorder counts every sandbox network flow in the metrics and logs
// it: refused flows at info level (an operator wants to see what was
// blocked), allowed ones at debug. Info lines are rate-limited per
// sandbox, and then daemon-wide; what is dropped is counted and the count
// is logged with the sandbox's next line. The audit log will take the
// same events through the same interface.
type flowRecorder struct {
	log    *slog.Logger
	flows  metrics.Counter
	bytes  metrics.Counter
	global *rate.Limiter

	// audit, if set, gets every flow event.
	audit audit.Sink

	mu sync.Mutex
	// +checklocks:mu
	sandboxes map[string]*sandboxLog
}

// sandboxLog is one sandbox's log allowance.
type sandboxLog struct {
	limit      *rate.Limiter
	suppressed int64
}

// newFlowRecorder returns a recorder counting in reg, logging to log and,
// when sink is not nil, keeping every flow in the audit trail.
func newFlowRecorder(log *slog.Logger, reg *metrics.Registry, sink audit.Sink) *flowRecorder {
	return &flowRecorder{
		log:       log,
		audit:     sink,
		flows:     reg.Counter("fence_egress_flows_total", "Sandbox network flows by protocol and decision."),
		bytes:     reg.Counter("fence_egress_bytes_total", "Bytes through sandbox network flows, by direction."),
		global:    rate.NewLimiter(globalLogRate, 2*globalLogRate),
		sandboxes: map[string]*sandboxLog{},
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
	if r.audit != nil {
		r.audit.Append(ctx, flowAudit(ev, decision))
	}
	r.bytes.Add(ev.BytesOut, "direction", "out")
	r.bytes.Add(ev.BytesIn, "direction", "in")
	if !r.log.Enabled(ctx, level) {
		return
	}
	var suppressed int64
	if level >= slog.LevelInfo {
		var ok bool
		if ok, suppressed = r.allow(ev.SandboxID); !ok {
			return
		}
	}
	attrs := []any{"sandbox_id", ev.SandboxID, "proto", ev.Proto,
		"dst", ev.Dst.String(), "name", ev.Name, "observed", ev.Observed, "decision", decision,
		"reason", ev.Reason, "bytes_out", ev.BytesOut, "bytes_in", ev.BytesIn, "duration", ev.Duration}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed_before", suppressed)
	}
	if ev.Suppressed > 0 {
		attrs = append(attrs, "attempts_dropped", ev.Suppressed)
	}
	r.log.Log(ctx, level, "network flow", attrs...)
}

// allow reports whether sandbox id may log a line now and, if so, how
// many of its lines were dropped since its previous one.
func (r *flowRecorder) allow(id string) (bool, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sandboxes[id]
	if s == nil {
		if len(r.sandboxes) >= maxLogLimiters {
			r.sweepLocked()
		}
		s = &sandboxLog{limit: rate.NewLimiter(sandboxLogRate, sandboxLogBurst)}
		r.sandboxes[id] = s
	}
	if !s.limit.Allow() || !r.global.Allow() {
		s.suppressed++
		return false, 0
	}
	n := s.suppressed
	s.suppressed = 0
	return true, n
}

// sweepLocked forgets sandboxes whose allowance is full again and which
// have nothing suppressed: a fresh limiter would be the same. If that is
// not enough, it forgets arbitrary ones (their suppressed counts are lost,
// and they get a fresh allowance).
//
// +checklocks:r.mu
func (r *flowRecorder) sweepLocked() {
	for id, s := range r.sandboxes {
		if s.suppressed == 0 && s.limit.Tokens() >= sandboxLogBurst {
			delete(r.sandboxes, id)
		}
	}
	for id := range r.sandboxes {
		if len(r.sandboxes) < maxLogLimiters/2 {
			break
		}
		delete(r.sandboxes, id)
	}
}

// registerNetMetrics exposes the counters of the sandboxes' network
// stacks: what they refused or limited, and the flow memory charged.
func registerNetMetrics(reg *metrics.Registry, n *egress.Shared) {
	for _, c := range []struct {
		name, help string
		v          func(egress.SharedStats) int64
	}{
		{"fence_egress_refused_early_total", "TCP connection attempts refused by policy before any state was made for them.", func(s egress.SharedStats) int64 { return s.Refused }},
		{"fence_egress_syn_limited_total", "TCP connection attempts dropped over a sandbox's rate of new or refused flows.", func(s egress.SharedStats) int64 { return s.SYNLimited }},
		{"fence_egress_flow_limited_total", "TCP flows refused because the sandbox had its maximum open.", func(s egress.SharedStats) int64 { return s.FlowLimited }},
		{"fence_egress_budget_refused_total", "TCP flows refused because the sandbox's memory share or the daemon's budget was spent.", func(s egress.SharedStats) int64 { return s.BudgetRefused }},
		{"fence_egress_packets_paced_total", "Packets the daemon waited for because a sandbox exceeded its packet rate.", func(s egress.SharedStats) int64 { return s.PacketsPaced }},
		{"fence_egress_dns_limited_total", "DNS queries dropped or delayed over a sandbox's query rate.", func(s egress.SharedStats) int64 { return s.DNSLimited }},
		{"fence_egress_dns_tcp_refused_total", "DNS-over-TCP connections closed because the sandbox had its maximum open.", func(s egress.SharedStats) int64 { return s.DNSTCPRefused }},
	} {
		reg.CounterFunc(c.name, c.help, func() int64 { return c.v(n.Stats()) })
	}
	reg.GaugeFunc("fence_egress_flow_memory_reserved_bytes", "Worst-case memory charged to the sandboxes' open TCP flows.", func() int64 { return n.Stats().Reserved })
}

// flowAudit is the audit record of a flow event.
func flowAudit(ev egress.FlowEvent, decision string) audit.Event {
	d := map[string]any{"proto": ev.Proto, "dst": ev.Dst.String(), "decision": decision, "reason": ev.Reason}
	for k, v := range map[string]string{"name": ev.Name, "observed": ev.Observed, "rule": ev.Rule, "error": ev.Err} {
		if v != "" {
			d[k] = v
		}
	}
	if ev.Proto != "dns" {
		d["src"] = ev.Src.String()
		d["bytes_out"], d["bytes_in"], d["duration_ms"] = ev.BytesOut, ev.BytesIn, ev.Duration.Milliseconds()
	}
	if len(ev.Answers) > 0 {
		as := make([]string, len(ev.Answers))
		for i, a := range ev.Answers {
			as[i] = a.String()
		}
		d["answers"] = as
	}
	if ev.Intercepted {
		d["intercepted"] = true
	}
	if ev.Suppressed > 0 {
		d["attempts_dropped"] = ev.Suppressed
	}
	return audit.Event{Type: audit.TypeFlow, Time: ev.Start, SandboxID: ev.SandboxID, Actor: "sandbox", Data: d}
}
