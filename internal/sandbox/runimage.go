package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/sandbox/startup"
)

// Templates' run images are startup.Images; the Manager computes their
// keys (runImageKey) and keeps their layers (imageLayers).

// runImageKey is the key of a create's run image, "" when it may not use
// one: the template root, backend, limits, agent configuration, start and
// ready commands and requested network; none with secrets bound.
func runImageKey(spec isolation.Spec, rt Runtime, req CreateRequest, phEnv map[string]string) string {
	if rt.StartCmd == "" || len(phEnv) > 0 || len(req.Secrets) > 0 || len(req.Volumes) > 0 {
		return ""
	}
	raw, err := json.Marshal(struct {
		RootFS, Backend, Start, Ready string
		Limits                        isolation.Limits
		Agent                         isolation.AgentConfig
		Internet                      *bool
		Network                       any
	}{spec.RootFS, spec.Backend, rt.StartCmd, rt.ReadyCmd, spec.Limits, spec.Agent, req.AllowInternetAccess, req.Network})
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// imageLayers is the Manager's layers as run images use them; nil (no
// images) when the Manager keeps no layers.
func imageLayers(m *Manager) startup.Layers {
	if m.layers == nil {
		return nil
	}
	return runImageLayers{m}
}

type runImageLayers struct{ m *Manager }

func (l runImageLayers) BootOn(ctx context.Context, spec isolation.Spec, nc *netconf.Config, layer string) (isolation.Sandbox, error) {
	return bootOn(ctx, l.m.fences, l.m.layers, spec, nc, layer)
}

func (l runImageLayers) DeleteLayer(ctx context.Context, id string) error {
	return l.m.layers.DeleteLayer(ctx, id)
}

func (l runImageLayers) Hold() func() { return l.m.keeper.Hold() }

func (l runImageLayers) Collect() { l.m.keeper.Collect() }
