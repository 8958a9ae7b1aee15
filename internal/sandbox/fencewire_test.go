package sandbox

import (
	"context"
	"testing"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/gateway"
)

// recordGateway keeps the config lookup the Manager gives each sandbox.
type recordGateway map[string]func() *gateway.Config

func (g recordGateway) ForSandbox(id string, cfg func() *gateway.Config) egress.Interceptor {
	g[id] = cfg
	return nil
}

type flowsSeen []egress.FlowEvent

func (f *flowsSeen) Record(_ context.Context, ev egress.FlowEvent) { *f = append(*f, ev) }

// The Manager binds the fence it is given: each stack's gateway reads the
// sandbox's config from the Manager, and each flow's bytes count in the
// sandbox's usage before the fence's recorder gets the flow.
func TestFenceWiredToGatewayAndUsage(t *testing.T) {
	gw := recordGateway{}
	var seen flowsSeen
	e := newEnv(t, func(o *Options) {
		o.Gateway = gw
		o.Fence.Recorder = &seen
	})
	s := e.mustCreate(t, CreateRequest{})
	f := e.m.fences.fence
	f.Interceptor(s.ID)
	if cfg, ok := gw[s.ID]; !ok || cfg() != e.m.GatewayConfig(s.ID) {
		t.Fatalf("the gateway got no config lookup of %s reading the Manager's", s.ID)
	}
	f.Recorder.Record(t.Context(), egress.FlowEvent{SandboxID: s.ID, BytesOut: 300, BytesIn: 4000})
	if len(seen) != 1 || seen[0].SandboxID != s.ID {
		t.Fatalf("the fence's recorder got %v, want the flow", seen)
	}
	u := liveUsage{e.m}.LiveUsage(s.ID)
	if len(u) != 1 || u[0].EgressBytesOut != 300 || u[0].EgressBytesIn != 4000 {
		t.Errorf("usage of %s = %+v, want 300 bytes out and 4000 in", s.ID, u)
	}
}
