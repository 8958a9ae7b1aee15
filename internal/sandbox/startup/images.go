package startup

import (
	"context"
	"log/slog"
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
// Made the same way means the same key, which the core computes from the
// template root, backend, limits, agent configuration (environment, user,
// workdir), start and ready commands and requested network: a sandbox
// never gets an image made with another environment or network than its
// own. Creates that bind secrets (their placeholders are per sandbox)
// have no key. The images are layers the core keeps (Layers lists them
// to its collector) for the Images' lifetime, at most maxRunImages (the
// oldest goes first); a restart starts without.

// maxRunImages bounds the run images kept.
const maxRunImages = 16

// Layers is what run images need of the core's layers.
type Layers interface {
	// BootOn boots spec, with the compiled network nc, on layer.
	BootOn(ctx context.Context, spec isolation.Spec, nc *netconf.Config, layer string) (isolation.Sandbox, error)
	// DeleteLayer deletes a layer nothing uses.
	DeleteLayer(ctx context.Context, id string) error
	// Hold keeps the layer collector from running until release is
	// called.
	Hold() (release func())
	// Collect asks the layer collector to run.
	Collect()
}

// Images keeps templates' run images.
type Images struct {
	layers Layers // nil: no images
	log    *slog.Logger

	mu sync.Mutex
	// +checklocks:mu
	byKey map[string]string // key → layer
	// +checklocks:mu
	order []string // keys, oldest first
}

// NewImages returns the run images kept on layers; nil layers (a backend
// that keeps none) keeps no image. A nil log discards.
func NewImages(layers Layers, log *slog.Logger) *Images {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Images{layers: layers, log: log}
}

func (r *Images) get(key string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byKey[key]
}

// put records layer for key and reports whether an old image was dropped.
func (r *Images) put(key, layer string) bool {
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
func (r *Images) drop(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byKey, key)
}

// Layers lists the kept images' layers (the collector keeps them).
func (r *Images) Layers() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.byKey))
	for _, l := range r.byKey {
		out = append(out, l)
	}
	return out
}

// Boot boots spec on the run image of key, if there is one; nil without
// one or when it fails to boot (then it is dropped and the caller creates
// the sandbox the ordinary way).
func (r *Images) Boot(ctx context.Context, key string, spec isolation.Spec, nc *netconf.Config) isolation.Sandbox {
	if key == "" || r.layers == nil {
		return nil
	}
	release := r.layers.Hold()
	defer release()
	layer := r.get(key)
	if layer == "" {
		return nil
	}
	box, err := r.layers.BootOn(ctx, spec, nc, layer)
	if err != nil {
		r.log.WarnContext(ctx, "booting a template's run image failed; starting anew", "layer", layer, "err", err)
		r.drop(key)
		r.layers.Collect()
		return nil
	}
	return box
}

// Keep checkpoints box, whose start command just got ready, as key's run
// image, when its backend's checkpoints keep memory (it has
// isolation.FileCheckpointer for its pauses without memory). A failure is
// logged: the sandbox is fine, the next create starts anew.
func (r *Images) Keep(ctx context.Context, key string, box isolation.Sandbox) {
	if key == "" || r.layers == nil {
		return
	}
	cp, ok := isolation.As[isolation.Checkpointer](box)
	if _, mem := isolation.As[isolation.FileCheckpointer](box); !ok || !mem {
		return
	}
	release := r.layers.Hold()
	defer release()
	info, err := cp.Checkpoint(context.WithoutCancel(ctx))
	if err != nil {
		r.log.WarnContext(ctx, "keeping a template's run image failed", "sandbox_id", box.ID(), "err", err)
		return
	}
	if !info.Memory {
		_ = r.layers.DeleteLayer(context.WithoutCancel(ctx), info.ID)
		return
	}
	if r.put(key, info.ID) {
		r.layers.Collect()
	}
	r.log.InfoContext(ctx, "template run image kept", "sandbox_id", box.ID(), "layer", info.ID, "took", info.Took)
}
