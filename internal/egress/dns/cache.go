package dns

import (
	"context"
	"errors"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
)

// Cache holds upstream answers shared by the resolvers of one daemon, so
// that sandboxes asking for the same allowed name cost one upstream query
// per TTL, and concurrent identical queries cost one between them. It
// holds the upstream's message as received; each Resolver still applies
// its own policy to it (names, never-reachable addresses) and records
// which addresses it handed out to its own sandbox.
//
// Only a query for a name some sandbox's policy allows reaches the cache,
// so it holds nothing a sandbox could not have learnt from the upstream
// resolver itself; that one sandbox can tell from the answer's reduced
// TTL that another asked for the same name recently is as true of the
// host's caching resolver behind it.
//
// Entries live for the smallest TTL of their records (a negative answer:
// its SOA's negative TTL, at most maxNegativeTTL; without SOA it is not
// kept); answers with a zero TTL and failures are not kept. The Cache holds
// at most its size in entries: past it, expired entries go first, then
// arbitrary ones. It is safe for concurrent use.
type Cache struct {
	max int

	mu sync.Mutex
	// +checklocks:mu
	entries map[cacheKey]*cacheEntry
	// +checklocks:mu
	calls map[cacheKey]*cacheCall
}

const maxNegativeTTL = 60 * time.Second

type cacheKey struct {
	upstream, name string
	qtype          uint16
}

type cacheEntry struct {
	msg     *mdns.Msg
	stored  time.Time
	expires time.Time
}

type cacheCall struct {
	done chan struct{}
	msg  *mdns.Msg
	err  error
}

// NewCache returns a Cache of at most size entries.
func NewCache(size int) *Cache {
	return &Cache{max: max(1, size), entries: map[cacheKey]*cacheEntry{}, calls: map[cacheKey]*cacheCall{}}
}

// Len returns the number of entries.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// exchange returns the upstream's answer for key: from the cache with its
// TTLs reduced by the time it was held, from a concurrent identical query,
// or from fetch, whose result it keeps. The returned message is the
// caller's own copy.
func (c *Cache) exchange(ctx context.Context, k cacheKey, now time.Time, fetch func(context.Context) (*mdns.Msg, error)) (*mdns.Msg, error) {
	c.mu.Lock()
	if e := c.entries[k]; e != nil {
		if now.Before(e.expires) {
			m := e.msg.Copy()
			c.mu.Unlock()
			age := uint32(now.Sub(e.stored) / time.Second)
			for _, rr := range append(m.Answer, m.Ns...) {
				rr.Header().Ttl -= min(age, rr.Header().Ttl)
			}
			return m, nil
		}
		delete(c.entries, k)
	}
	if call := c.calls[k]; call != nil {
		c.mu.Unlock()
		select {
		case <-call.done:
			if call.err != nil {
				return nil, call.err
			}
			return call.msg.Copy(), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	call := &cacheCall{done: make(chan struct{})}
	c.calls[k] = call
	c.mu.Unlock()

	// The fetch serves every waiter: it does not end with the caller.
	call.msg, call.err = fetch(context.WithoutCancel(ctx))
	if call.err == nil && call.msg == nil {
		call.err = errors.New("dns: empty upstream answer")
	}
	c.mu.Lock()
	delete(c.calls, k)
	if call.err == nil {
		if ttl := cacheTTL(call.msg); ttl > 0 {
			c.storeLocked(k, &cacheEntry{msg: call.msg, stored: now, expires: now.Add(ttl)}, now)
		}
	}
	c.mu.Unlock()
	close(call.done)
	if call.err != nil {
		return nil, call.err
	}
	return call.msg.Copy(), nil
}

// +checklocks:c.mu
func (c *Cache) storeLocked(k cacheKey, e *cacheEntry, now time.Time) {
	if len(c.entries) >= c.max {
		for k2, e2 := range c.entries {
			if !now.Before(e2.expires) {
				delete(c.entries, k2)
			}
		}
		for k2 := range c.entries {
			if len(c.entries) < c.max {
				break
			}
			delete(c.entries, k2)
		}
	}
	c.entries[k] = e
}

// cacheTTL is how long m may be kept: 0 for not at all.
func cacheTTL(m *mdns.Msg) time.Duration {
	if m.Truncated {
		return 0
	}
	switch {
	case m.Rcode == mdns.RcodeSuccess && len(m.Answer) > 0:
		ttl := m.Answer[0].Header().Ttl
		for _, rr := range m.Answer {
			ttl = min(ttl, rr.Header().Ttl)
		}
		return time.Duration(ttl) * time.Second
	case m.Rcode == mdns.RcodeSuccess || m.Rcode == mdns.RcodeNameError:
		for _, rr := range m.Ns {
			if soa, ok := rr.(*mdns.SOA); ok {
				return min(time.Duration(min(soa.Minttl, soa.Hdr.Ttl))*time.Second, maxNegativeTTL)
			}
		}
	}
	return 0
}
