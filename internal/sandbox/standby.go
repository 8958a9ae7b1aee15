package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
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
// A sandbox has at most one standby, and the manager at most maxStandbys;
// one boots at a time. A standby is killed when another replaces it, and
// when its sandbox is paused, killed or dies, or the manager shuts down.
type standby struct {
	layer string
	key   string        // its fence's key until the hand-over (fences.standbyNetwork)
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

// maxStandbys bounds the standbys of a manager (the ones booting too).
const maxStandbys = 64

// standbyDelay is how long a standby waits before its boot: checkpoints
// in quick succession (one before every command) boot only the last one's,
// and a boot does not compete with the next checkpoint (on btrfs, its
// subvolume's creation holds up the snapshot's transaction).
const standbyDelay = 300 * time.Millisecond

// prepareStandby starts booting a standby of e on layer, replacing e's
// previous one. It does nothing on backends without standbys, or when
// the manager has maxStandbys.
func (m *Manager) prepareStandby(e *entry, layer string) {
	if m.noStandbys {
		return
	}
	box := e.sb()
	if _, ok := isolation.As[isolation.StandbyBooter](box); !ok {
		return
	}
	sb := &standby{layer: layer, key: "standby-" + isolation.NewID(), ready: make(chan struct{}), gone: make(chan struct{})}
	m.mu.Lock()
	if m.closed || m.running[box.ID()] != e {
		m.mu.Unlock()
		return
	}
	e.mu.Lock()
	old := e.standby
	// Without headroom to spare for it, a rewind boots instead.
	if old == nil && (m.standbys >= maxStandbys || !m.adm.admitAhead()) {
		e.mu.Unlock()
		m.mu.Unlock()
		return
	}
	if old == nil {
		m.standbys++
	}
	e.standby = sb
	e.mu.Unlock()
	m.mu.Unlock()
	m.dropStandby(old)

	spec := e.spec
	spec.ID = box.ID()
	spec.Background, spec.Standby = true, true
	spec.Network = m.fences.Standby(sb.key) // deny-all until the hand-over
	m.wg.Go(func() {
		defer close(sb.ready)
		delay := time.NewTimer(standbyDelay)
		defer delay.Stop()
		select {
		case <-delay.C:
		case <-sb.gone:
			return
		case <-m.stop:
			return
		}
		select {
		case m.standbyBoot <- struct{}{}:
		case <-sb.gone: // replaced before its turn
			return
		case <-m.stop:
			return
		}
		defer func() { <-m.standbyBoot }()
		sb.mu.Lock()
		dropped := sb.dropped
		sb.booting = !dropped
		sb.mu.Unlock()
		if dropped {
			return
		}
		// The layer stays while the standby is e's (the collector keeps
		// it), or a rewind that took it holds the layers' lock: the boot
		// takes no lock that a rewind waiting for it could hold up.
		ctx := context.Background()
		nb, err := m.layers.CreateOn(ctx, spec, layer)
		if err != nil {
			m.log.Warn("booting a standby for rewinds", "sandbox_id", spec.ID, "err", err)
			return
		}
		sb.mu.Lock()
		dropped = sb.dropped
		if !dropped {
			sb.box = nb
		}
		sb.mu.Unlock()
		if dropped {
			m.killBox(ctx, nb)
		}
	})
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
func (m *Manager) dropStandby(sb *standby) {
	if sb == nil {
		return
	}
	if box := sb.finish(); box != nil {
		m.killBox(context.Background(), box)
	}
}

// releaseStandby takes e's standby away from it and kills it.
func (m *Manager) releaseStandby(e *entry) {
	m.dropStandby(m.detachStandby(e, ""))
}

// detachStandby takes e's standby away from it (only one on layer, unless
// layer is ""), for the caller to use or drop.
func (m *Manager) detachStandby(e *entry, layer string) *standby {
	m.mu.Lock()
	defer m.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	sb := e.standby
	if sb == nil || (layer != "" && sb.layer != layer) {
		return nil
	}
	e.standby = nil
	m.standbys--
	return sb
}

// takeStandby returns e's standby on layer once booted, if it is alive,
// with its fence's key, for a rewind to hand over; nil if there is none.
// The standby is no longer e's either way.
func (m *Manager) takeStandby(ctx context.Context, e *entry, layer string) (isolation.Sandbox, string) {
	sb := m.detachStandby(e, layer)
	if sb == nil {
		return nil, ""
	}
	sb.mu.Lock()
	waiting := !sb.booting && sb.box == nil
	sb.mu.Unlock()
	if waiting {
		// Still queued behind other standbys' boots: booting now is
		// quicker.
		m.dropStandby(sb)
		return nil, ""
	}
	select {
	case <-sb.ready:
	case <-ctx.Done():
		m.dropStandby(sb)
		return nil, ""
	}
	box := sb.finish()
	if box == nil {
		return nil, ""
	}
	select {
	case <-box.Done():
		m.killBox(ctx, box)
		return nil, ""
	default:
	}
	return box, sb.key
}

// handOver makes a standby the sandbox: its fence becomes the sandbox's,
// with the network nc (its proxy first, then its policy), and it gets the
// ordinary CPU weight.
func (m *Manager) handOver(box isolation.Sandbox, key string, nc *netconf.Config) error {
	nw := m.fences.HandOver(box.ID(), key)
	if nw == nil {
		return fmt.Errorf("standby of %s has no network attached", box.ID())
	}
	m.fences.Apply(nw, nc, true)
	if f, ok := isolation.As[isolation.Foregrounder](box); ok {
		if err := f.Foreground(); err != nil {
			return err
		}
	}
	return nil
}
