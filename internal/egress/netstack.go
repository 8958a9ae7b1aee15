package egress

import (
	"context"
	"errors"
	"fmt"
	"golang.org/x/time/rate"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/fencesandbox/fence/internal/egress/dns"
	"github.com/fencesandbox/fence/internal/egress/policy"
)

// DialFunc dials an upstream destination from the host. network is "tcp";
// address is an IP literal and port ("203.0.113.10:443", "[2001:db8::1]:443").
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// Recorder receives one event per flow and per DNS query. Record must not
// block for long: it runs on the flow's goroutine.
type Recorder interface {
	Record(ctx context.Context, ev FlowEvent)
}

// FlowEvent is the audit fact about one flow or DNS query.
type FlowEvent struct {
	SandboxID string
	Proto     string // "tcp", "udp", "dns"
	Src       netip.AddrPort
	Dst       netip.AddrPort
	// Name is the resolver name that justified the flow, or the DNS
	// question name for "dns" events.
	Name string
	// Observed is the TLS SNI or HTTP Host the client presented, if peeked.
	Observed string
	Allowed  bool
	Reason   string // policy.Reason*, dns.Reason*, or one of this package's Reason*
	Rule     string
	// Answers are the addresses a DNS query was answered with.
	Answers  []netip.Addr
	BytesOut int64 // sandbox → upstream
	BytesIn  int64 // upstream → sandbox
	Start    time.Time
	Duration time.Duration
	Err      string // dial or copy error, if any
	// Intercepted is set when the egress gateway relayed the flow (and
	// decided each of its requests, with events of its own).
	Intercepted bool
	// Suppressed counts the sandbox's refused connection attempts that
	// the stack dropped without an event of their own (over the refused
	// rate) since its previous event that carried such a count.
	Suppressed int64
}

// Reasons the stack itself adds to policy and resolver reasons.
const (
	ReasonLimit      = "conn-limit"      // too many concurrent flows
	ReasonDialFailed = "dial-failed"     // allowed, but the upstream dial failed
	ReasonUDP        = "udp-not-dns"     // UDP other than DNS to the resolver
	ReasonSniff      = "sniff-malformed" // TLS/HTTP start malformed or incomplete, or the client waited past the check
	ReasonNoName     = "no-name"         // TLS without SNI or HTTP without Host to a name-only destination
	ReasonHostAddr   = policy.ReasonNeverReachable
	ReasonRateLimit  = "rate-limit" // carries Suppressed: refused attempts dropped over the rate
)

// Options configures a Stack.
type Options struct {
	// SandboxID labels events.
	SandboxID string
	// FD is the TUN device (IFF_TUN|IFF_NO_PI) of the sandbox's netns, opened
	// by the caller. The Stack takes ownership and closes it in Close. Set
	// exactly one of FD (> 0) and Link.
	FD int
	// Link is an already built link endpoint (tests, or a backend with its
	// own transport) carrying raw IP packets without link headers.
	Link stack.LinkEndpoint
	// MTU of the TUN device (default DefaultMTU). Used only with FD.
	MTU uint32
	// TrustChecksums makes the stack take the checksums of the packets it
	// reads from FD as they are, for a device whose other end leaves them
	// out (runsc's stack, whose link offloads them). Otherwise every
	// packet's checksums are verified: a process in the sandbox able to
	// write raw packets could write any. Used only with FD.
	TrustChecksums bool

	Policy *policy.Policy
	// DNSUpstream is the "ip:port" of the resolver the daemon uses.
	DNSUpstream string
	// HostAddrs are the host's own addresses; they are refused even if the
	// policy was compiled without them.
	HostAddrs []netip.Addr
	Recorder  Recorder
	// Dial dials upstream (default: DialDirect, a net.Dialer's dial that
	// takes a connection established at once without waiting).
	Dial DialFunc
	// Proxy, if set, is the SOCKS5 proxy every allowed TCP flow is
	// tunnelled through (see SetProxy).
	Proxy  *Proxy
	Logger *slog.Logger

	// Bandwidth bounds the sandbox's TCP traffic, in bytes per second in
	// each direction, shared by all its flows. Zero means no limit.
	Bandwidth int64
	// Shared is the daemon-wide state the stack draws from: the memory
	// budget of its flows and the DNS answer cache. Nil means a private
	// one with the defaults (tests, one-off stacks).
	Shared *Shared
	// MaxConns bounds concurrent egress TCP flows (default 256); the
	// sandbox's memory share usually binds first (see "Budgets" in the
	// package doc).
	MaxConns int
	// MaxIngress bounds concurrent ingress connections (DialSandbox),
	// which do not count against MaxConns (default 64).
	MaxIngress int
	// NewFlowRate bounds the allowed TCP connection attempts per second
	// (burst: twice as many); attempts over it are dropped and the
	// sandbox retransmits them (default 200).
	NewFlowRate float64
	// RefusedRate bounds the refused TCP connection attempts per second
	// that get a RST and an event (burst: twice as many); attempts over it
	// are dropped silently and counted (default 50).
	RefusedRate float64
	// PacketRate bounds the packets per second the stack reads from the
	// sandbox (burst: a tenth of it); over it, the stack stops reading
	// and the sandbox's kernel queues or drops them (default 10000). Each
	// TCP segment with data sent to the sandbox lets one more packet in
	// (its acknowledgement; see filterEndpoint).
	PacketRate float64
	// DNSRate bounds the DNS queries per second the stack answers (burst:
	// twice as many); UDP queries over it are dropped, TCP ones wait
	// (default 100).
	DNSRate float64
	// MaxPending bounds TCP handshakes being decided at once (default 256);
	// SYNs beyond it are dropped and retransmitted by the sandbox.
	MaxPending int
	// ConnectTimeout bounds the upstream dial (default 10 s).
	ConnectTimeout time.Duration
	// PeekTimeout is how long the stack waits for the first bytes of a flow
	// that needs its name verified (default 10 s). Data from the upstream
	// is forwarded meanwhile, so server-first protocols are not delayed.
	PeekTimeout time.Duration
	// DNSMaxTTL and DNSGrace: see dns.Config.
	DNSMaxTTL, DNSGrace time.Duration
	// Interceptor, if set, is asked about every allowed TCP flow once its
	// first client bytes are known, and relays those it wants (the egress
	// gateway). Nil relays every allowed flow as it is.
	Interceptor Interceptor
	// Ask, if set, is asked about a name the sandbox looks up that its
	// policy does not allow (for want of an allow rule): the lookup waits
	// for its answer (see Approval). It must return when ctx ends.
	Ask func(ctx context.Context, name string) Approval
	// Admit, if set, is asked before each TCP flow the policy allows,
	// and again once the flow is tracked (an EndFlows from then on
	// reaches it): a non-empty answer refuses the flow, recorded with
	// that reason (a team's spent egress: ReasonEgressSpent).
	Admit func() string
}

const nicID tcpip.NICID = 1

// timeWait is how long the stack's end of a flow it closed first stays
// in TIME-WAIT (see build).
const timeWait = 100 * time.Millisecond

// Stack is one sandbox's network stack. Its methods are safe for
// concurrent use.
type Stack struct {
	opts     Options
	log      *slog.Logger
	s        *stack.Stack
	link     stack.LinkEndpoint
	sendQ    *sendQueue // the NIC's queue of packets to the sandbox
	resolver *dns.Resolver
	policy   atomic.Pointer[policy.Policy]
	proxy    atomic.Pointer[Proxy]
	hostAddr map[netip.Addr]bool
	dial     DialFunc
	slots    chan struct{} // egress flows
	ingress  chan struct{} // DialSandbox connections
	dnsConns chan struct{} // DNS-over-TCP connections
	acct     account
	// newFlows, refused and dnsQueries enforce the Options rates.
	newFlows, refused, dnsQueries *rate.Limiter
	suppressed                    atomic.Int64
	// upLimit and downLimit enforce Options.Bandwidth; nil when unlimited.
	upLimit, downLimit *rate.Limiter

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	// flows are the egress flows of conns (EndFlows resets them); mu
	// guards them, as it guards conns.
	flows map[net.Conn]tcpip.Endpoint

	udpDenied recentSet
	held      atomic.Int32 // DNS lookups waiting for Options.Ask

	grants grantSet // names approved once (ask.go)
}

// grantSet is a stack's policy as set last and the names approved once
// on top of it.
type grantSet struct {
	mu sync.Mutex
	// base is the policy set last; the one in force adds grants.
	// +checklocks:mu
	base *policy.Policy
	// byName are the names approved once, with their expiry.
	// +checklocks:mu
	byName map[string]time.Time
}

// New builds the stack on the TUN fd (or link) and starts serving. ctx
// bounds nothing but is the parent of every flow's context; Close stops
// the stack.
func New(ctx context.Context, opts Options) (*Stack, error) {
	if (opts.FD > 0) == (opts.Link != nil) {
		if opts.FD > 0 {
			unix.Close(opts.FD)
		}
		return nil, errors.New("egress: set exactly one of Options.FD and Options.Link")
	}
	closeFD := func() {
		if opts.FD > 0 {
			unix.Close(opts.FD)
		}
	}
	if opts.Policy == nil {
		closeFD()
		return nil, errors.New("egress: no policy")
	}
	if opts.Shared == nil {
		opts.Shared = NewShared(SharedOptions{})
	}
	var ref *Stack // the resolver's Ask reaches the stack made below
	res, err := newResolver(opts, func(ctx context.Context, name string) bool { return ref.ask(ctx, name) })
	if err != nil {
		closeFD()
		return nil, fmt.Errorf("creating resolver: %w", err)
	}
	opts.setDefaults()
	link := opts.Link
	if opts.FD > 0 {
		// The link owns the fd from here on (it closes it on error too).
		link, err = newTunLink(opts.FD, opts.MTU, opts.TrustChecksums)
		if err != nil {
			return nil, fmt.Errorf("creating TUN link endpoint: %w", err)
		}
	}
	st := newStack(ctx, opts, link, res)
	ref = st
	if err := st.build(); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// newResolver makes the stack's DNS resolver, which refuses the names
// the interceptor refuses when it checks names.
func newResolver(opts Options, ask func(context.Context, string) bool) (*dns.Resolver, error) {
	dcfg := dns.Config{Upstream: opts.DNSUpstream, Policy: opts.Policy, MaxTTL: opts.DNSMaxTTL, Grace: opts.DNSGrace, Cache: opts.Shared.cache}
	if opts.Ask != nil {
		dcfg.Ask = ask
	}
	if nc, ok := opts.Interceptor.(NameChecker); ok {
		dcfg.Refuse = nc.RefuseName
	}
	return dns.New(dcfg)
}

// setDefaults fills in the zero (or negative) limits, timeouts, logger
// and recorder of o with their documented defaults.
func (o *Options) setDefaults() {
	if o.MTU == 0 {
		o.MTU = DefaultMTU
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 256
	}
	if o.MaxIngress <= 0 {
		o.MaxIngress = 64
	}
	if o.NewFlowRate <= 0 {
		o.NewFlowRate = 200
	}
	if o.RefusedRate <= 0 {
		o.RefusedRate = 50
	}
	if o.PacketRate <= 0 {
		o.PacketRate = 10000
	}
	if o.DNSRate <= 0 {
		o.DNSRate = 100
	}
	if o.MaxPending <= 0 {
		o.MaxPending = 256
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.PeekTimeout <= 0 {
		o.PeekTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Recorder == nil {
		o.Recorder = nopRecorder{}
	}
}

// newStack makes the Stack of opts (defaults set) on link, with its
// limits, before its network stack is built.
func newStack(ctx context.Context, opts Options, link stack.LinkEndpoint, res *dns.Resolver) *Stack {
	dial := opts.Dial
	if dial == nil {
		dial = DialDirect
	}
	st := &Stack{
		opts:       opts,
		log:        opts.Logger.With("sandbox", opts.SandboxID),
		link:       link,
		resolver:   res,
		hostAddr:   map[netip.Addr]bool{},
		dial:       dial,
		slots:      make(chan struct{}, opts.MaxConns),
		ingress:    make(chan struct{}, opts.MaxIngress),
		dnsConns:   make(chan struct{}, maxDNSConns),
		acct:       account{s: opts.Shared},
		newFlows:   rate.NewLimiter(rate.Limit(opts.NewFlowRate), int(max(1, 2*opts.NewFlowRate))),
		refused:    rate.NewLimiter(rate.Limit(opts.RefusedRate), int(max(1, 2*opts.RefusedRate))),
		dnsQueries: rate.NewLimiter(rate.Limit(opts.DNSRate), int(max(1, 2*opts.DNSRate))),
		conns:      map[net.Conn]struct{}{},
	}
	if opts.Bandwidth > 0 {
		burst := int(max(opts.Bandwidth/10, 64<<10))
		st.upLimit = rate.NewLimiter(rate.Limit(opts.Bandwidth), burst)
		st.downLimit = rate.NewLimiter(rate.Limit(opts.Bandwidth), burst)
	}
	st.udpDenied.init(1024, 10*time.Second)
	for _, a := range opts.HostAddrs {
		st.hostAddr[a.Unmap().WithZone("")] = true
	}
	st.policy.Store(opts.Policy)
	st.grants.base = opts.Policy
	st.proxy.Store(opts.Proxy)
	st.ctx, st.cancel = context.WithCancel(ctx)
	return st
}

func (st *Stack) build() error {
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	st.s = s
	for _, o := range []tcpip.SettableTransportProtocolOption{
		ptr(tcpip.TCPSACKEnabled(true)),
		ptr(tcpip.TCPModerateReceiveBufferOption(true)),
		// Small buffers that grow only while data moves (see shared.go).
		&tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: flowBufDefault, Max: flowBufMax},
		&tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: flowBufDefault, Max: flowBufMax},
		// The sandbox reuses a 4-tuple whose flow the stack closed first:
		// accept a new SYN on a TIME-WAIT endpoint, and keep TIME-WAIT short
		// (the link neither reorders nor duplicates). Shorter than the
		// least retransmission timeout (gVisor's MinRTO, 200 ms): the
		// retransmission timer of a closed flow's last segments stays
		// armed once they are acknowledged (gVisor only marks it
		// disabled) and fires in a goroutine of its own unless the
		// endpoint's end stops it first. A final ACK the sandbox's kernel
		// dropped is answered, once TIME-WAIT has ended, by a RST to its
		// FIN sent again, which ends its side as well.
		ptr(tcpip.TCPTimeWaitReuseGlobal),
		ptr(tcpip.TCPTimeWaitTimeoutOption(timeWait)),
		// No RACK loss detection, and with it no tail loss probes: their
		// timers (2 × SRTT for a probe, where Linux adds at least two
		// clock ticks; a quarter of the minimum RTT for reordering) are
		// tens or hundreds of microseconds on a link of memory, which a busy
		// scheduler overruns: the stack then re-sent 64 KiB segments the
		// sandbox had received (BenchmarkTUNDownload's dup-segs/GB: 10 to
		// 67 with the CPUs contended, none without RACK) and entered a
		// recovery that shrank its window. Nothing is lost between the
		// two stacks but what the sandbox's kernel drops, which SACK
		// recovery and the retransmission timer still repair.
		ptr(tcpip.TCPRecovery(0)),
	} {
		if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, o); err != nil {
			return fmt.Errorf("setting TCP option %T: %s", o, err)
		}
	}
	pace := rate.NewLimiter(rate.Limit(st.opts.PacketRate), int(max(1, st.opts.PacketRate/10)))
	fep := newFilterEndpoint(st.ctx, st.link, pace, &st.opts.Shared.stats.packetsPaced)
	st.sendQ = newSendQueue(fep)
	st.sendQ.holder = fep
	if err := s.CreateNICWithOptions(nicID, fep, stack.NICOptions{QDisc: st.sendQ}); err != nil {
		return fmt.Errorf("creating NIC: %s", err)
	}
	// Promiscuous + spoofing: accept packets for every destination and
	// answer as that destination.
	if err := s.SetPromiscuousMode(nicID, true); err != nil {
		return fmt.Errorf("setting promiscuous mode: %s", err)
	}
	if err := s.SetSpoofing(nicID, true); err != nil {
		return fmt.Errorf("setting spoofing: %s", err)
	}
	for _, a := range []struct {
		addr netip.Addr
		bits int
	}{{GatewayIPv4, SandboxIPv4.Bits()}, {ResolverIPv4, SandboxIPv4.Bits()}, {GatewayIPv6, SandboxIPv6.Bits()}, {ResolverIPv6, SandboxIPv6.Bits()}} {
		proto := ipv4.ProtocolNumber
		if a.addr.Is6() {
			proto = ipv6.ProtocolNumber
		}
		pa := tcpip.ProtocolAddress{Protocol: proto, AddressWithPrefix: tcpip.AddressWithPrefix{Address: toTCPIP(a.addr), PrefixLen: a.bits}}
		if err := s.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
			return fmt.Errorf("adding address %v: %s", a.addr, err)
		}
	}
	s.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: nicID},
		{Destination: header.IPv6EmptySubnet, NIC: nicID},
	})

	fwd := tcp.NewForwarder(s, flowBufDefault, st.opts.MaxPending, st.handleTCP)
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, st.gateSYN(fwd.HandlePacket))
	ufwd := udp.NewForwarder(s, st.handleUDP)
	s.SetTransportProtocolHandler(udp.ProtocolNumber, ufwd.HandlePacket)

	return st.serveDNS()
}

func ptr[T any](v T) *T { return &v }

// SetPolicy replaces the policy for new flows and DNS queries.
func (st *Stack) SetPolicy(p *policy.Policy) {
	if p == nil {
		return
	}
	st.grants.mu.Lock()
	defer st.grants.mu.Unlock()
	st.grants.base = p
	st.applyLocked()
}

// Policy returns the current policy.
func (st *Stack) Policy() *policy.Policy { return st.policy.Load() }

// DialSandbox opens a TCP connection from the stack (GatewayIPv4) to port
// on the sandbox (SandboxIPv4): ingress for envd and exposed ports. It
// counts against MaxIngress and is closed by Close.
func (st *Stack) DialSandbox(ctx context.Context, port uint16) (net.Conn, error) {
	select {
	case st.ingress <- struct{}{}:
	default:
		return nil, fmt.Errorf("dialing sandbox port %d: too many connections", port)
	}
	release := func() { <-st.ingress }
	c, err := gonet.DialTCPWithBind(ctx, st.s,
		tcpip.FullAddress{NIC: nicID, Addr: toTCPIP(GatewayIPv4)},
		tcpip.FullAddress{NIC: nicID, Addr: toTCPIP(SandboxIPv4.Addr()), Port: port},
		ipv4.ProtocolNumber)
	if err != nil {
		release()
		return nil, fmt.Errorf("dialing sandbox port %d: %w", port, err)
	}
	tc := &trackedConn{Conn: c, st: st, release: release}
	if !st.track(tc) {
		c.Close()
		release()
		return nil, fmt.Errorf("dialing sandbox port %d: %w", port, net.ErrClosed)
	}
	return tc, nil
}

// trackedConn releases its slot when closed.
type trackedConn struct {
	net.Conn
	st      *Stack
	release func()
	once    sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.st.untrack(c)
		c.release()
	})
	return err
}

// CloseWrite half-closes the connection.
func (c *trackedConn) CloseWrite() error { return c.Conn.(*gonet.TCPConn).CloseWrite() }

// Close stops the stack: it closes every flow, the TUN fd and the link.
// It is idempotent.
func (st *Stack) Close() error {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return nil
	}
	st.closed = true
	conns := st.conns
	st.conns = nil
	st.mu.Unlock()
	st.flushSuppressed()
	st.cancel()
	for c := range conns {
		c.Close()
	}
	if l, ok := st.link.(*tunLink); ok {
		l.stop() // before the stack's Wait (see stop)
	}
	if st.s != nil {
		st.s.Close()
		st.s.Wait()
	}
	st.wg.Wait()
	if st.link != nil && st.opts.FD > 0 {
		st.link.Close()
		st.link.Wait()
	}
	// The TUN link closed the device's fd.
	if st.acct.heavy() {
		st.opts.Shared.returnMemory()
	}
	return nil
}

// flow is one egress TCP flow's claim on its stack: a slot and the memory
// charged to the sandbox's share for it.
type flow struct {
	st    *Stack
	small bool
	once  sync.Once

	mu sync.Mutex
	// +checklocks:mu
	cost int64
	// +checklocks:mu
	released bool
	// +checklocks:mu
	bulk bool
	// +checklocks:mu
	stays bool // the flow keeps the send queue's writer (keepWriter)
}

// acquireFlow takes a slot and charges the flow's worst-case memory: a
// full flow if the share and the budget allow it, else a small one. It
// reports false, taking nothing, when neither is possible.
func (st *Stack) acquireFlow() (*flow, bool) {
	select {
	case st.slots <- struct{}{}:
	default:
		st.opts.Shared.stats.flowLimited.Add(1)
		return nil, false
	}
	f := &flow{st: st}
	f.cost = fullFlowCost
	// Full flows may take half the share; the rest is for small ones, so
	// that a sandbox with many flows open still gets some.
	if !st.acct.reserve(fullFlowCost, st.opts.Shared.opts.Share/2) {
		f.cost, f.small = smallFlowCost, true
		if !st.acct.reserve(smallFlowCost, st.opts.Shared.opts.Share) {
			<-st.slots
			st.opts.Shared.stats.budgetRefused.Add(1)
			return nil, false
		}
	}
	return f, true
}

// size fixes the buffers of a small flow's endpoint at smallBufSize
// (which also turns their auto-tuning off); a full flow keeps the stack's
// auto-tuned buffers, bounded by flowBufMax.
func (f *flow) size(ep tcpip.Endpoint) {
	if f.small {
		ep.SocketOptions().SetReceiveBufferSize(smallBufSize, true)
		ep.SocketOptions().SetSendBufferSize(smallBufSize, true)
	}
}

// growSend gives a full flow that has moved bulkAfter bytes towards the
// sandbox a send buffer of bulkSendBufSize (fixed: auto-tuning stops),
// if the sandbox's share for full flows and the daemon's budget can pay
// the difference, which the flow then holds until released. A larger
// send buffer keeps more of the upstream's data in flight to the sandbox,
// so the relay blocks less often waiting for its acknowledgements.
func (f *flow) growSend(ep tcpip.Endpoint) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.small || f.bulk || f.released {
		return
	}
	f.bulk = true
	extra := int64(bulkSendBufSize - flowBufMax)
	if !f.st.acct.reserve(extra, f.st.opts.Shared.opts.Share/2) {
		return
	}
	f.cost += extra
	ep.SocketOptions().SetSendBufferSize(bulkSendBufSize, true)
}

// keepWriter makes a flow that has moved bulkAfter bytes towards the
// sandbox keep the send queue's writer until it is released (see
// sendQueue): its next segments then find the writer waiting instead of
// starting one per burst.
func (f *flow) keepWriter() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stays || f.released || f.st.sendQ == nil {
		return
	}
	f.stays = true
	f.st.sendQ.stay()
}

// release returns the slot and the memory, and the send queue's writer;
// it is idempotent.
func (f *flow) release() {
	f.once.Do(func() {
		f.mu.Lock()
		f.released = true
		cost, stays := f.cost, f.stays
		f.mu.Unlock()
		if stays {
			f.st.sendQ.leave()
		}
		f.st.acct.release(cost)
		<-f.st.slots
	})
}

func (st *Stack) track(c net.Conn) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return false
	}
	st.conns[c] = struct{}{}
	return true
}

func (st *Stack) untrack(c net.Conn) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.conns != nil {
		delete(st.conns, c)
	}
	delete(st.flows, c)
}

func (st *Stack) record(ev FlowEvent) {
	ev.SandboxID = st.opts.SandboxID
	st.opts.Recorder.Record(st.ctx, ev)
}

type nopRecorder struct{}

func (nopRecorder) Record(context.Context, FlowEvent) {}

// recentSet remembers keys for a while, bounded, to rate-limit events.
type recentSet struct {
	mu   sync.Mutex
	max  int
	ttl  time.Duration
	seen map[string]time.Time
}

func (r *recentSet) init(max int, ttl time.Duration) {
	r.max, r.ttl, r.seen = max, ttl, map[string]time.Time{}
}

// add reports whether key is new (not seen within ttl).
func (r *recentSet) add(key string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.seen[key]; ok && now.Sub(t) < r.ttl {
		return false
	}
	if len(r.seen) >= r.max {
		for k, t := range r.seen {
			if now.Sub(t) >= r.ttl {
				delete(r.seen, k)
			}
		}
		if len(r.seen) >= r.max {
			return false // saturated: stay quiet rather than flood
		}
	}
	r.seen[key] = now
	return true
}
