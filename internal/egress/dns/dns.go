// Package dns is a sandbox's DNS resolver. It answers A and AAAA queries
// only for names the sandbox's policy allows, resolving them through one
// configured upstream resolver, and remembers which addresses it handed
// out for which name so the flow decision can check that a destination
// came from an allowed name.
//
// # What it guarantees
//
//   - A query for a name the policy does not allow gets NXDOMAIN and never
//     leaves the host: no upstream query is made for it, and nothing but the
//     question name of an allowed query (and its type, A or AAAA) is sent
//     upstream. Other query types (TXT, MX, NULL, PTR, ANY, ...) are
//     answered locally: NOERROR without data for allowed names, NXDOMAIN
//     otherwise.
//   - Answers are rebuilt, not relayed: only A/AAAA records reached from the
//     question name through the CNAME chain are returned, under the
//     question name, with a TTL capped at [Config.MaxTTL].
//   - An address the policy can never reach ([policy.Policy.Reachable]:
//     loopback, link-local, metadata, private, the host) is removed from an
//     answer and not recorded (DNS-rebinding defence); an answer left empty
//     becomes NOERROR without data.
//   - With [Config.Ask] set, a query for a name the policy refuses for
//     want of an allow rule waits for Ask's answer before any upstream
//     query; a name a deny rule names is refused without asking.
//   - [Resolver.NamesFor] returns only names whose record is within its TTL
//     plus [Config.Grace].
//
// # What it does not do
//
// It does not listen on sockets (the egress stack serves UDP and TCP and
// calls [Resolver.Resolve]), does not cache answers unless given a
// shared [Cache] (whose answers it filters like fresh ones), does not validate
// DNSSEC, and does not stop a sandbox from encoding data in the names it
// is allowed to resolve below an allowed wildcard.
package dns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/fencesandbox/fence/internal/egress/policy"
)

// Config configures a Resolver.
type Config struct {
	// Upstream is the "host:port" of the recursive resolver the daemon
	// itself uses.
	Upstream string
	// Policy decides which names resolve and which answers are kept.
	Policy *policy.Policy
	// MaxTTL caps the TTL given to the sandbox (default 5 min).
	MaxTTL time.Duration
	// Grace is how long past its TTL a handed-out address still counts
	// for flow decisions, for clients that cache longer (default 30 s).
	Grace time.Duration
	// MaxRecords bounds the remembered (address, name) pairs (default 4096).
	MaxRecords int
	// Timeout bounds one upstream exchange (default 5 s).
	Timeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Cache, if set, is shared with other resolvers: upstream answers for
	// allowed names are taken from it and kept in it (see Cache).
	Cache *Cache
	// Refuse, if set, is asked about every valid name before the policy;
	// a name it refuses gets NXDOMAIN and its reason, and never reaches
	// the upstream (the egress gateway refuses secret placeholders).
	Refuse func(name string) (reason string, refused bool)
	// Ask, if set, is asked about a valid name the policy refuses only for
	// want of an allow rule (not one a deny rule names): the query waits
	// for its answer, and a name it allows is resolved as if the policy
	// allowed it. It must return when ctx ends.
	Ask func(ctx context.Context, name string) bool
}

// Reasons in a Result.
const (
	ReasonAllowed     = "allowed"
	ReasonQType       = "qtype-not-served"   // allowed name, type other than A/AAAA
	ReasonUnreachable = "unreachable-answer" // every answer address was never-reachable
	ReasonUpstream    = "upstream-error"
	ReasonMalformed   = "malformed-query"
	ReasonApproved    = "approved" // the policy did not allow the name; Config.Ask did
)

// Result describes one query, for the audit record.
type Result struct {
	Name    string // question name, normalised
	Type    string // "A", "AAAA", "TXT", ...
	Allowed bool   // the name was allowed by the policy
	Reason  string // a Reason constant or a policy reason
	Rcode   string // "NOERROR", "NXDOMAIN", ...
	Answers []netip.Addr
	Dropped []netip.Addr // never-reachable addresses removed from the answer
}

type record struct {
	names map[string]time.Time // name → expiry
}

// Resolver answers a sandbox's queries. It is safe for concurrent use.
type Resolver struct {
	cfg    Config
	policy atomic.Pointer[policy.Policy]
	client *mdns.Client
	tcp    *mdns.Client

	mu    sync.Mutex
	recs  map[netip.Addr]*record
	count int
}

// New returns a Resolver.
func New(cfg Config) (*Resolver, error) {
	if cfg.Policy == nil {
		return nil, errors.New("dns: no policy")
	}
	if cfg.Upstream == "" {
		return nil, errors.New("dns: no upstream resolver")
	}
	if _, err := netip.ParseAddrPort(cfg.Upstream); err != nil {
		return nil, fmt.Errorf("dns: parsing upstream %q: %w", cfg.Upstream, err)
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = 5 * time.Minute
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 30 * time.Second
	}
	if cfg.MaxRecords <= 0 {
		cfg.MaxRecords = 4096
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Resolver{
		cfg:    cfg,
		client: &mdns.Client{Net: "udp", Timeout: cfg.Timeout, UDPSize: 4096},
		tcp:    &mdns.Client{Net: "tcp", Timeout: cfg.Timeout},
		recs:   map[netip.Addr]*record{},
	}
	r.policy.Store(cfg.Policy)
	return r, nil
}

// SetPolicy replaces the policy for later queries. Records already handed
// out stay; flow decisions judge them under the new policy.
func (r *Resolver) SetPolicy(p *policy.Policy) { r.policy.Store(p) }

// Resolve answers one DNS message from the sandbox. resp is nil only when
// the query cannot be parsed at all (the caller drops it).
func (r *Resolver) Resolve(ctx context.Context, query []byte) (resp []byte, res Result) {
	var q mdns.Msg
	if err := q.Unpack(query); err != nil || q.Response || len(q.Question) != 1 || q.Opcode != mdns.OpcodeQuery {
		res.Reason = ReasonMalformed
		if err != nil || q.Response {
			return nil, res
		}
		m := new(mdns.Msg)
		m.SetRcode(&q, mdns.RcodeFormatError)
		res.Rcode = mdns.RcodeToString[m.Rcode]
		b, _ := m.Pack()
		return b, res
	}
	m := r.answer(ctx, &q, &res)
	res.Rcode = mdns.RcodeToString[m.Rcode]
	m.Compress = true
	if m.Len() > 512 && !ednsOK(&q, m.Len()) {
		m.Truncate(512)
	}
	b, err := m.Pack()
	if err != nil {
		f := new(mdns.Msg)
		f.SetRcode(&q, mdns.RcodeServerFailure)
		b, _ = f.Pack()
		res.Reason, res.Rcode = ReasonUpstream, "SERVFAIL"
	}
	return b, res
}

func ednsOK(q *mdns.Msg, n int) bool {
	o := q.IsEdns0()
	return o != nil && int(o.UDPSize()) >= n
}

func (r *Resolver) answer(ctx context.Context, q *mdns.Msg, res *Result) *mdns.Msg {
	qs := q.Question[0]
	res.Type = mdns.TypeToString[qs.Qtype]
	if res.Type == "" {
		res.Type = fmt.Sprintf("TYPE%d", qs.Qtype)
	}
	m := new(mdns.Msg)
	m.SetReply(q)
	m.RecursionAvailable = true
	name, valid := policy.NormalizeName(qs.Name)
	res.Name = name
	if !valid || qs.Qclass != mdns.ClassINET {
		res.Name = strings.ToLower(qs.Name)
		res.Reason = policy.ReasonNameNotAllowed
		m.Rcode = mdns.RcodeNameError
		return m
	}
	if r.cfg.Refuse != nil {
		if reason, refused := r.cfg.Refuse(name); refused {
			res.Reason = reason
			m.Rcode = mdns.RcodeNameError
			return m
		}
	}
	p := r.policy.Load()
	ok, reason := p.AllowName(name)
	if !ok && reason == policy.ReasonNameNotAllowed && r.cfg.Ask != nil && r.cfg.Ask(ctx, name) {
		ok, reason = true, ReasonApproved
		p = r.policy.Load() // the approval may have changed it
	}
	res.Allowed, res.Reason = ok, reason
	if !ok {
		m.Rcode = mdns.RcodeNameError
		return m
	}
	if qs.Qtype != mdns.TypeA && qs.Qtype != mdns.TypeAAAA {
		res.Reason = ReasonQType
		return m // NOERROR, no data
	}

	up := new(mdns.Msg)
	up.SetQuestion(mdns.Fqdn(name), qs.Qtype)
	up.RecursionDesired = true
	up.SetEdns0(1232, false)
	resp, err := r.exchange(ctx, up)
	if err != nil {
		res.Reason = ReasonUpstream
		m.Rcode = mdns.RcodeServerFailure
		return m
	}
	switch resp.Rcode {
	case mdns.RcodeSuccess:
	case mdns.RcodeNameError:
		m.Rcode = mdns.RcodeNameError
		return m
	default:
		res.Reason = ReasonUpstream
		m.Rcode = mdns.RcodeServerFailure
		return m
	}

	// Follow the CNAME chain from the question name.
	target, ttl := cnameTarget(resp.Answer, mdns.Fqdn(name), uint32(r.cfg.MaxTTL/time.Second))
	addrs, ttl := reachableAddrs(resp.Answer, target, qs.Qtype, p, ttl, res)
	if len(addrs) == 0 {
		if len(res.Dropped) > 0 {
			res.Reason = ReasonUnreachable
		}
		return m
	}
	res.Answers = addrs
	r.remember(name, addrs, time.Duration(ttl)*time.Second)
	for _, a := range addrs {
		hdr := mdns.RR_Header{Name: qs.Name, Rrtype: qs.Qtype, Class: mdns.ClassINET, Ttl: ttl}
		if a.Is4() {
			m.Answer = append(m.Answer, &mdns.A{Hdr: hdr, A: a.AsSlice()})
		} else {
			m.Answer = append(m.Answer, &mdns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	return m
}

// cnameTarget follows the CNAME chain in answer from target (16 links at
// most) to the name that holds the addresses, and lowers ttl to that of
// each link.
func cnameTarget(answer []mdns.RR, target string, ttl uint32) (string, uint32) {
	for range 16 {
		next := ""
		for _, rr := range answer {
			if c, ok := rr.(*mdns.CNAME); ok && strings.EqualFold(c.Hdr.Name, target) {
				next = c.Target
				ttl = min(ttl, c.Hdr.Ttl)
			}
		}
		if next == "" {
			break
		}
		target = next
	}
	return target, ttl
}

// reachableAddrs gives the addresses of type qtype that answer holds for
// target and that the policy p lets the sandbox reach, and lowers ttl to
// theirs; the others are recorded in res.Dropped.
func reachableAddrs(answer []mdns.RR, target string, qtype uint16, p *policy.Policy, ttl uint32, res *Result) ([]netip.Addr, uint32) {
	var addrs []netip.Addr
	for _, rr := range answer {
		if !strings.EqualFold(rr.Header().Name, target) || rr.Header().Rrtype != qtype {
			continue
		}
		var a netip.Addr
		switch v := rr.(type) {
		case *mdns.A:
			a, _ = netip.AddrFromSlice(v.A.To4())
		case *mdns.AAAA:
			a, _ = netip.AddrFromSlice(v.AAAA.To16())
		}
		if !a.IsValid() {
			continue
		}
		if !p.Reachable(a) {
			res.Dropped = append(res.Dropped, a)
			continue
		}
		ttl = min(ttl, rr.Header().Ttl)
		addrs = append(addrs, a)
	}
	return addrs, ttl
}

// exchange asks the upstream resolver, through the cache if there is one.
func (r *Resolver) exchange(ctx context.Context, up *mdns.Msg) (*mdns.Msg, error) {
	fetch := func(ctx context.Context) (*mdns.Msg, error) {
		ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		defer cancel()
		resp, _, err := r.client.ExchangeContext(ctx, up, r.cfg.Upstream)
		if err == nil && resp.Truncated {
			resp, _, err = r.tcp.ExchangeContext(ctx, up, r.cfg.Upstream)
		}
		if err == nil && resp.Id != up.Id {
			err = errors.New("dns: upstream answer with another id")
		}
		return resp, err
	}
	if r.cfg.Cache == nil {
		return fetch(ctx)
	}
	q := up.Question[0]
	return r.cfg.Cache.exchange(ctx, cacheKey{upstream: r.cfg.Upstream, name: q.Name, qtype: q.Qtype}, r.cfg.Now(), fetch)
}

func (r *Resolver) remember(name string, addrs []netip.Addr, ttl time.Duration) {
	now := r.cfg.Now()
	exp := now.Add(ttl + r.cfg.Grace)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.count+len(addrs) > r.cfg.MaxRecords {
		r.sweepLocked(now)
	}
	for _, a := range addrs {
		rec := r.recs[a]
		if rec == nil {
			rec = &record{names: map[string]time.Time{}}
			r.recs[a] = rec
		}
		if _, ok := rec.names[name]; !ok {
			r.count++
		}
		rec.names[name] = exp
	}
	// Still over the bound: forget arbitrary records.
	for a, rec := range r.recs {
		if r.count <= r.cfg.MaxRecords {
			break
		}
		r.count -= len(rec.names)
		delete(r.recs, a)
	}
}

func (r *Resolver) sweepLocked(now time.Time) {
	for a, rec := range r.recs {
		for n, exp := range rec.names {
			if !now.Before(exp) {
				delete(rec.names, n)
				r.count--
			}
		}
		if len(rec.names) == 0 {
			delete(r.recs, a)
		}
	}
}

// NamesFor returns the names addr was handed out for that are still valid.
func (r *Resolver) NamesFor(addr netip.Addr) []string {
	addr = addr.Unmap()
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.recs[addr]
	if rec == nil {
		return nil
	}
	var names []string
	for n, exp := range rec.names {
		if now.Before(exp) {
			names = append(names, n)
		}
	}
	return names
}
