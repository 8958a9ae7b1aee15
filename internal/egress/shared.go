package egress

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencesandbox/fence/internal/egress/dns"
)

// Per-flow buffer sizes and the memory a flow is charged for. The stack
// starts every TCP flow with small buffers and grows them (receive-buffer
// moderation, send-buffer auto-tuning) only while data moves, up to
// flowBufMax per direction. A flow is charged its worst case up front:
// both buffers full, the two relay copy buffers and the goroutines and
// connection state around them. When a sandbox's share cannot pay for a
// full flow, the flow gets buffers fixed at smallBufSize instead, and a
// small relay buffer in both directions. A full flow that has moved
// bulkAfter bytes towards the sandbox may grow its send buffer to
// bulkSendBufSize, charged then (flow.growSend).
const (
	flowBufDefault = 64 << 10
	flowBufMax     = 256 << 10
	smallBufSize   = 16 << 10
	// relayBufSize is the relay buffer towards the upstream and both of
	// a small flow's; bulkRelayBufSize the one towards the sandbox of a
	// full flow, taken once a read fills the small one (forward.go: downRelaySizes).
	relayBufSize     = 64 << 10
	bulkRelayBufSize = 256 << 10
	bulkSendBufSize  = 2 << 20
	bulkAfter        = 1 << 20
	// flowExtra: the peek buffer, goroutine stacks and endpoint state.
	flowExtra     = 32 << 10
	fullFlowCost  = 2*flowBufMax + relayBufSize + bulkRelayBufSize + flowExtra // 864 KiB
	smallFlowCost = 2*smallBufSize + 2*relayBufSize + flowExtra                // 192 KiB
)

// Defaults of SharedOptions.
const (
	DefaultBudget      = 1 << 30
	DefaultShare       = 64 << 20
	DefaultFloor       = 4 << 20
	DefaultDNSCacheLen = 4096
)

// SharedOptions configures a Shared.
type SharedOptions struct {
	// Budget is the daemon-wide bound, in bytes, on the flow memory that
	// sandboxes draw beyond their floors (default DefaultBudget).
	Budget int64
	// Share bounds one sandbox's flow memory (default DefaultShare).
	Share int64
	// Floor is the part of a sandbox's share that does not count against
	// Budget, so that a sandbox can always open some flows however many
	// others exhaust the budget (default DefaultFloor, at most Share).
	Floor int64
	// DNSCacheLen bounds the answers the shared DNS cache holds (default
	// DefaultDNSCacheLen; negative disables the cache).
	DNSCacheLen int
}

// Shared is what the stacks of one daemon share: the memory budget their
// flows draw from, the DNS answer cache, and the counters of what the
// stacks refused or limited. It is safe for concurrent use.
type Shared struct {
	opts  SharedOptions
	cache *dns.Cache

	mu sync.Mutex
	// +checklocks:mu
	used int64 // charged beyond floors, ≤ opts.Budget

	stats sharedCounters

	// freeing is set while a returnMemory is running; lastFree is when
	// the last one started (UnixNano).
	freeing  atomic.Bool
	lastFree atomic.Int64
}

type sharedCounters struct {
	refused, synLimited, flowLimited, budgetRefused, packetsPaced, dnsLimited, dnsTCPRefused atomic.Int64
	reserved                                                                                 atomic.Int64
}

// SharedStats are the counters of a Shared, for metrics.
type SharedStats struct {
	// Refused counts TCP connection attempts refused by policy before any
	// state was created for them (answered with RST).
	Refused int64
	// SYNLimited counts connection attempts dropped because the sandbox
	// exceeded its rate of refused or new flows (TCP retransmits them).
	SYNLimited int64
	// FlowLimited counts flows refused because the sandbox had its
	// maximum number of flows open.
	FlowLimited int64
	// BudgetRefused counts flows refused because neither the sandbox's
	// share nor the daemon's budget could pay for them.
	BudgetRefused int64
	// PacketsPaced counts packets the link had to wait for because the
	// sandbox exceeded its packet rate.
	PacketsPaced int64
	// DNSLimited counts DNS queries dropped or delayed by the per-sandbox
	// query rate.
	DNSLimited int64
	// DNSTCPRefused counts DNS-over-TCP connections closed at once because
	// the sandbox had its maximum open.
	DNSTCPRefused int64
	// Reserved is the flow memory currently charged, in bytes, floors
	// included.
	Reserved int64
}

// NewShared returns a Shared.
func NewShared(o SharedOptions) *Shared {
	if o.Budget <= 0 {
		o.Budget = DefaultBudget
	}
	if o.Share <= 0 {
		o.Share = DefaultShare
	}
	if o.Floor <= 0 {
		o.Floor = DefaultFloor
	}
	o.Floor = min(o.Floor, o.Share)
	if o.DNSCacheLen == 0 {
		o.DNSCacheLen = DefaultDNSCacheLen
	}
	s := &Shared{opts: o}
	if o.DNSCacheLen > 0 {
		s.cache = dns.NewCache(o.DNSCacheLen)
	}
	return s
}

// Stats returns the counters.
func (s *Shared) Stats() SharedStats {
	c := &s.stats
	return SharedStats{
		Refused: c.refused.Load(), SYNLimited: c.synLimited.Load(), FlowLimited: c.flowLimited.Load(),
		BudgetRefused: c.budgetRefused.Load(), PacketsPaced: c.packetsPaced.Load(),
		DNSLimited: c.dnsLimited.Load(), DNSTCPRefused: c.dnsTCPRefused.Load(), Reserved: c.reserved.Load(),
	}
}

// Returning memory to the host after a stack that used much of it closes.
const (
	freeAfter    = 8 << 20 // a stack whose flows were charged more than this
	freeInterval = 10 * time.Second
)

// returnMemory gives the heap freed by a closed stack back to the host
// soon (a garbage collection and a scavenge, a second later, when the
// stack's last flow goroutines have unwound), at most once per
// freeInterval. Otherwise the Go runtime returns it over minutes, and the
// daemon's RSS stays at what one sandbox's flood made it.
func (s *Shared) returnMemory() {
	now := time.Now().UnixNano()
	if now-s.lastFree.Load() < int64(freeInterval) || !s.freeing.CompareAndSwap(false, true) {
		return
	}
	s.lastFree.Store(now)
	time.AfterFunc(time.Second, func() {
		defer s.freeing.Store(false)
		debug.FreeOSMemory()
	})
}

// account is one stack's share of a Shared.
type account struct {
	s  *Shared
	mu sync.Mutex
	// +checklocks:mu
	used int64
	// +checklocks:mu
	peak int64
}

// heavy reports whether the account was ever charged more than freeAfter.
func (a *account) heavy() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peak > freeAfter
}

// reserve charges n bytes to the account, and to the daemon's budget for
// the part above the floor. It reports false, charging nothing, when the
// account would go over limit (at most the share) or the budget over its
// total.
func (a *account) reserve(n, limit int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.s.opts
	if a.used+n > min(limit, o.Share) {
		return false
	}
	extra := max(0, a.used+n-o.Floor) - max(0, a.used-o.Floor)
	if extra > 0 {
		a.s.mu.Lock()
		if a.s.used+extra > o.Budget {
			a.s.mu.Unlock()
			return false
		}
		a.s.used += extra
		a.s.mu.Unlock()
	}
	a.used += n
	a.peak = max(a.peak, a.used)
	a.s.stats.reserved.Add(n)
	return true
}

// release returns n bytes charged by reserve.
func (a *account) release(n int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.s.opts
	extra := max(0, a.used-o.Floor) - max(0, a.used-n-o.Floor)
	if extra > 0 {
		a.s.mu.Lock()
		a.s.used -= extra
		a.s.mu.Unlock()
	}
	a.used -= n
	a.s.stats.reserved.Add(-n)
}
