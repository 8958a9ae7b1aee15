package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netfence"
)

// fences is the Manager's network fence: one netfence.Net per sandbox ID,
// which every backend sandbox of that ID attaches its network namespaces
// to (a create, a gVisor resume, a rewind's reboot under the same ID). A
// Net lives while the Manager holds its sandbox (own to drop) or a
// namespace is attached to it, whichever ends last: a warm pool's sandbox,
// started before the Manager knows it, has one (deny-all) from its create,
// and the create that takes it owns it and sets its policy.
type fences struct {
	fence *netfence.Fence

	mu sync.Mutex
	// +checklocks:mu
	byID map[string]*fenceRef
}

// fenceRef is one sandbox's Net and what keeps it.
type fenceRef struct {
	id    string // its key in byID; "" once a hand-over replaced it
	nw    *netfence.Net
	links int  // namespaces attached (or being attached)
	owned bool // held by the Manager
}

func newFences(f netfence.Fence, log *slog.Logger) *fences {
	if f.Logger == nil {
		f.Logger = log
	}
	f = f.WithDefaults()
	return &fences{fence: &f, byID: map[string]*fenceRef{}}
}

// network returns the isolation.Network to create a sandbox with: its Net
// is made with policy pol and proxy (nil: deny all, directly) if the
// sandbox has none yet, as a new sandbox has not.
func (fs *fences) network(pol *policy.Policy, proxy *egress.Proxy) isolation.Network {
	return attacher{fs: fs, pol: pol, proxy: proxy}
}

// ref returns id's fenceRef, made with pol and proxy if there is none.
//
// +checklocks:fs.mu
func (fs *fences) refLocked(id string, pol *policy.Policy, proxy *egress.Proxy) *fenceRef {
	r := fs.byID[id]
	if r == nil {
		nw := fs.fence.New(pol)
		if proxy != nil {
			nw.SetProxy(proxy)
		}
		r = &fenceRef{id: id, nw: nw}
		fs.byID[id] = r
	}
	return r
}

// own makes the Manager hold id's Net (made with pol and proxy if it has
// none) until drop, and returns it.
func (fs *fences) own(id string, pol *policy.Policy, proxy *egress.Proxy) *netfence.Net {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	r := fs.refLocked(id, pol, proxy)
	r.owned = true
	return r.nw
}

// drop ends the Manager's hold on id's Net.
func (fs *fences) drop(id string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if r := fs.byID[id]; r != nil {
		r.owned = false
		fs.releaseLocked(r)
	}
}

// +checklocks:fs.mu
func (fs *fences) releaseLocked(r *fenceRef) {
	if !r.owned && r.links == 0 && r.id != "" && fs.byID[r.id] == r {
		delete(fs.byID, r.id)
	}
}

// standbyNetwork returns the isolation.Network of a standby (standby.go)
// booted beside sandbox id: a Net of its own under key, deny-all, which
// nothing dials, until handOver makes it id's.
func (fs *fences) standbyNetwork(key string) isolation.Network {
	return attacher{fs: fs, key: key}
}

// handOver makes the Net of the standby attached under key sandbox id's,
// held by the Manager as id's was; id's previous Net keeps only the
// namespaces attached to it (the replaced sandbox's, being released). The
// caller then gives it id's network (applyNetwork). It returns nil if the
// standby attached nothing.
func (fs *fences) handOver(id, key string) *netfence.Net {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	nr := fs.byID[key]
	if nr == nil {
		return nil
	}
	delete(fs.byID, key)
	if old := fs.byID[id]; old != nil {
		nr.owned = old.owned
		old.owned, old.id = false, ""
	}
	nr.id = id
	fs.byID[id] = nr
	return nr.nw
}

// get returns id's Net, if any.
func (fs *fences) get(id string) *netfence.Net {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if r := fs.byID[id]; r != nil {
		return r.nw
	}
	return nil
}

// dial connects to port inside sandbox id through its fence.
func (fs *fences) dial(ctx context.Context, id string, port uint16) (net.Conn, error) {
	nw := fs.get(id)
	if nw == nil {
		return nil, fmt.Errorf("dialing sandbox port %d: %w", port, isolation.ErrNotFound)
	}
	return nw.DialSandbox(ctx, port)
}

// attacher is the isolation.Network the Manager hands a backend.
type attacher struct {
	fs    *fences
	pol   *policy.Policy
	proxy *egress.Proxy
	key   string // the Net's key if not the sandbox's ID (a standby's)
}

// Attach implements isolation.Network.
func (a attacher) Attach(ctx context.Context, id, nsPath string, kernelPeer bool) (isolation.Link, error) {
	key := id
	if a.key != "" {
		key = a.key
	}
	a.fs.mu.Lock()
	r := a.fs.refLocked(key, a.pol, a.proxy)
	r.links++
	a.fs.mu.Unlock()
	l, err := r.nw.Attach(ctx, id, nsPath, kernelPeer)
	if err != nil {
		a.unref(r)
		return nil, err
	}
	return &heldLink{Link: l, release: func() { a.unref(r) }}, nil
}

func (a attacher) unref(r *fenceRef) {
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	r.links--
	a.fs.releaseLocked(r)
}

// heldLink is a Link that lets go of its Net when closed.
type heldLink struct {
	isolation.Link
	once    sync.Once
	release func()
}

// Close implements isolation.Link.
func (l *heldLink) Close() error {
	err := l.Link.Close()
	l.once.Do(l.release)
	return err
}
