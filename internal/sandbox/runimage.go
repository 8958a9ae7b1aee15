package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
)

// Run images: on a backend whose checkpoints keep memory (gvisor), the
// first sandbox of a template with a start command is checkpointed once
// its ready command passed, before anyone else can use it, and later
// sandboxes of the same template, made the same way, restore that image
// instead of running the start command again: they begin with the start
// command's processes running, as E2B's template snapshots do.
//
// Made the same way means the same template root, backend, limits, agent
// configuration (environment, user, workdir), start and ready commands and
// requested network: a sandbox never gets an image made with another
// environment or network than its own. Creates that bind secrets (their
// placeholders are per sandbox) neither use nor make images. The images
// are layers kept by the Manager (gc keeps them) for its lifetime, at most
// maxRunImages (the oldest goes first); a restart starts without.

// maxRunImages bounds the run images the Manager keeps.
const maxRunImages = 16

type runImages struct {
	mu sync.Mutex
	// +checklocks:mu
	byKey map[string]string // key → layer
	// +checklocks:mu
	order []string // keys, oldest first
}

// runImageKey is the key of a create's run image, "" when it may not use
// one.
func runImageKey(spec isolation.Spec, rt Runtime, req CreateRequest, phEnv map[string]string) string {
	if rt.StartCmd == "" || len(phEnv) > 0 || len(req.Secrets) > 0 {
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

func (r *runImages) get(key string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byKey[key]
}

// put records layer for key and reports whether an old image was dropped.
func (r *runImages) put(key, layer string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byKey == nil {
		r.byKey = map[string]string{}
	}
	if _, ok := r.byKey[key]; ok {
		return true // another create made one meanwhile: this one is unkept
	}
	r.byKey[key] = layer
	r.order = append(r.order, key)
	if len(r.order) <= maxRunImages {
		return false
	}
	delete(r.byKey, r.order[0])
	r.order = r.order[1:]
	return true
}

// drop forgets key's image (it no longer boots).
func (r *runImages) drop(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byKey, key)
}

// layers lists the kept images' layers.
func (r *runImages) layers() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.byKey))
	for _, l := range r.byKey {
		out = append(out, l)
	}
	return out
}

// bootRunImage boots spec on the run image of key, if there is one; nil
// without one or when it fails to boot (then it is dropped and the caller
// creates the sandbox the ordinary way).
func (m *Manager) bootRunImage(ctx context.Context, key string, spec isolation.Spec, nc *netconf.Config) isolation.Sandbox {
	if key == "" || m.layers == nil {
		return nil
	}
	defer m.keeper.Hold()()
	layer := m.runImages.get(key)
	if layer == "" {
		return nil
	}
	box, err := m.bootOn(ctx, spec, nc, layer)
	if err != nil {
		m.log.WarnContext(ctx, "booting a template's run image failed; starting anew", "layer", layer, "err", err)
		m.runImages.drop(key)
		m.keeper.Collect()
		return nil
	}
	return box
}

// keepRunImage checkpoints box, whose start command just got ready, as
// key's run image, when its backend's checkpoints keep memory (it has
// isolation.FileCheckpointer for its pauses without memory). A failure is
// logged: the sandbox is fine, the next create starts anew.
func (m *Manager) keepRunImage(ctx context.Context, key string, box isolation.Sandbox) {
	if key == "" || m.layers == nil {
		return
	}
	cp, ok := isolation.As[isolation.Checkpointer](box)
	if _, mem := isolation.As[isolation.FileCheckpointer](box); !ok || !mem {
		return
	}
	defer m.keeper.Hold()()
	info, err := cp.Checkpoint(context.WithoutCancel(ctx))
	if err != nil {
		m.log.WarnContext(ctx, "keeping a template's run image failed", "sandbox_id", box.ID(), "err", err)
		return
	}
	if !info.Memory {
		_ = m.layers.DeleteLayer(context.WithoutCancel(ctx), info.ID)
		return
	}
	if m.runImages.put(key, info.ID) {
		m.keeper.Collect()
	}
	m.log.InfoContext(ctx, "template run image kept", "sandbox_id", box.ID(), "layer", info.ID, "took", info.Took)
}
