package timetravel

import (
	"context"
	"sync"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox"
)

// A standby is a backend sandbox booted ahead, beside a running sandbox
// and under its ID, on the layer the sandbox was last checkpointed (or
// rewound) to, on a backend whose sandboxes implement
// isolation.StandbyBooter. A rewind to that layer hands the standby over
// instead of booting: the old processes are killed, the standby gets the
// ordinary CPU weight and the sandbox's network as it is now, and takes
// its place. Until then it runs the agent alone, with a low CPU weight and
// no way out (its egress is deny-all), and nothing reaches it.
//
// A sandbox has at most one standby, and a Keeper at most maxStandbys;
// one boots at a time. A standby is killed when another replaces it, and
// when its sandbox is paused, killed or dies (Release), or the Keeper
// closes.
type standby struct {
	layer string
	key   string        // its fence's key until the hand-over (sandbox.Live.StandbySpec)
	ready chan struct{} // closed once the boot ended
	gone  chan struct{} // closed when dropped

	mu sync.Mutex
	// +checklocks:mu
	box isolation.Sandbox // nil until booted, and once dropped or taken
	// +checklocks:mu
	dropped bool
	// +checklocks:mu
	booting bool // its boot has its turn (a rewind then waits for it)
}

// maxStandbys bounds the standbys of a Keeper (the ones booting too).
const maxStandbys = 64

// standbyDelay is how long a standby waits before its boot: checkpoints
// in quick succession (one before every command) boot only the last one's,
// and a boot does not compete with the next checkpoint (on btrfs, its
// subvolume's creation holds up the snapshot's transaction).
const standbyDelay = 300 * time.Millisecond

// prepareStandby starts booting a standby of l on layer, replacing l's
// previous one. It does nothing on backends without standbys, or when
// the Keeper has maxStandbys.
func (k *Keeper) prepareStandby(l *sandbox.Live, layer string) {
	if k.noStandbys {
		return
	}
	box := l.Box()
	if _, ok := isolation.As[isolation.StandbyBooter](box); !ok {
		return
	}
	sb := &standby{layer: layer, key: "standby-" + isolation.NewID(), ready: make(chan struct{}), gone: make(chan struct{})}
	spec := l.StandbySpec(sb.key) // deny-all until the hand-over
	id := box.ID()
	// The Keeper's lock is held from the check that l is live to the
	// standby's registration: a Release after its kill finds it.
	k.mu.Lock()
	if k.closed || !l.Current() {
		k.mu.Unlock()
		return
	}
	old := k.standbys[id]
	// Without headroom to spare for it, a rewind boots instead.
	if old == nil && (len(k.standbys) >= maxStandbys || !k.core.AdmitAhead()) {
		k.mu.Unlock()
		return
	}
	k.standbys[id] = sb
	k.wg.Go(func() { k.bootStandby(sb, spec) })
	k.mu.Unlock()
	k.dropStandby(old)
}

// bootStandby boots sb, after standbyDelay and its turn, unless it was
// dropped meanwhile.
func (k *Keeper) bootStandby(sb *standby, spec isolation.Spec) {
	defer close(sb.ready)
	delay := time.NewTimer(standbyDelay)
	defer delay.Stop()
	select {
	case <-delay.C:
	case <-sb.gone:
		return
	case <-k.stop:
		return
	}
	select {
	case k.standbyBoot <- struct{}{}:
	case <-sb.gone: // replaced before its turn
		return
	case <-k.stop:
		return
	}
	defer func() { <-k.standbyBoot }()
	sb.mu.Lock()
	dropped := sb.dropped
	sb.booting = !dropped
	sb.mu.Unlock()
	if dropped {
		return
	}
	// The layer stays while the standby is its sandbox's (the collector
	// keeps it), or a rewind that took it holds the layers' lock: the boot
	// takes no lock that a rewind waiting for it could hold up.
	ctx := context.Background()
	nb, err := k.layers.CreateOn(ctx, spec, sb.layer)
	if err != nil {
		k.log.Warn("booting a standby for rewinds", "sandbox_id", spec.ID, "err", err)
		return
	}
	sb.mu.Lock()
	dropped = sb.dropped
	if !dropped {
		sb.box = nb
	}
	sb.mu.Unlock()
	if dropped {
		k.kill(ctx, nb)
	}
}

// finish ends sb's life as a standby (dropped, or taken by a rewind): a
// boot still to come is skipped, one under way kills what it makes. It
// returns the sandbox sb booted, if any, which the caller now owns.
func (sb *standby) finish() isolation.Sandbox {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if !sb.dropped {
		sb.dropped = true
		close(sb.gone)
	}
	box := sb.box
	sb.box = nil
	return box
}

// dropStandby kills sb's sandbox, now or once it has booted.
func (k *Keeper) dropStandby(sb *standby) {
	if sb == nil {
		return
	}
	if box := sb.finish(); box != nil {
		k.kill(context.Background(), box)
	}
}

// Release takes sandbox id's standby away from it and kills it: the
// sandbox is paused, killed or gone, and nothing rewinds it meanwhile.
func (k *Keeper) Release(id string) {
	k.dropStandby(k.detachStandby(id, ""))
}

// detachStandby takes sandbox id's standby away from it (only one on
// layer, unless layer is ""), for the caller to use or drop.
func (k *Keeper) detachStandby(id, layer string) *standby {
	k.mu.Lock()
	defer k.mu.Unlock()
	sb := k.standbys[id]
	if sb == nil || (layer != "" && sb.layer != layer) {
		return nil
	}
	delete(k.standbys, id)
	return sb
}

// takeStandby returns sandbox id's standby on layer once booted, if it is
// alive, with its fence's key, for a rewind to hand over; nil if there is
// none. The standby is no longer the sandbox's either way.
func (k *Keeper) takeStandby(ctx context.Context, id, layer string) (isolation.Sandbox, string) {
	sb := k.detachStandby(id, layer)
	if sb == nil {
		return nil, ""
	}
	sb.mu.Lock()
	waiting := !sb.booting && sb.box == nil
	sb.mu.Unlock()
	if waiting {
		// Still queued behind other standbys' boots: booting now is
		// quicker.
		k.dropStandby(sb)
		return nil, ""
	}
	select {
	case <-sb.ready:
	case <-ctx.Done():
		k.dropStandby(sb)
		return nil, ""
	}
	box := sb.finish()
	if box == nil {
		return nil, ""
	}
	select {
	case <-box.Done():
		k.kill(ctx, box)
		return nil, ""
	default:
	}
	return box, sb.key
}
