package sandbox

import (
	"context"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/sandbox/usage"
)

// Gateway gives a sandbox's network stack its egress gateway, which asks
// cfg for the sandbox's current gateway config at every decision;
// *gateway.Gateway implements it.
type Gateway interface {
	ForSandbox(id string, cfg func() *gateway.Config) egress.Interceptor
}

// wire binds the fence to what the Manager keeps per sandbox: each
// stack's egress gateway reads the sandbox's config from the Manager
// (GatewayConfig), and every flow's bytes count in the sandbox's usage
// before the fence's own recorder gets the flow. The parts made before
// the Manager (the gateway, the flow recorder) so never refer to it.
func (fs *fences) wire(m *Manager, gw Gateway) {
	if gw != nil {
		fs.fence.Interceptor = func(id string) egress.Interceptor {
			return gw.ForSandbox(id, func() *gateway.Config { return m.GatewayConfig(id) })
		}
	}
	fs.fence.Recorder = usageRecorder{meter: m.usage, next: fs.fence.Recorder}
}

// usageRecorder counts each flow's bytes against its sandbox, then hands
// the flow on.
type usageRecorder struct {
	meter *usage.Meter
	next  egress.Recorder
}

func (r usageRecorder) Record(ctx context.Context, ev egress.FlowEvent) {
	if ev.SandboxID != "" {
		r.meter.AddEgress(ev.SandboxID, ev.BytesOut, ev.BytesIn)
	}
	r.next.Record(ctx, ev)
}
