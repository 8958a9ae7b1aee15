// Package warm keeps sandboxes started ahead of demand, so that a create
// only has to hand one out and configure its agent.
//
// Pool wraps an isolation.Backend and is one itself. A Create whose Spec
// leaves ID empty and has no binds may be served from the pool: the pool
// keeps up to Size started sandboxes for each (template, limits) it has
// been asked for recently, each already named (its ID is its hostname and
// cannot change later). The agent configuration of the request is then
// delivered to the agent over its connection (POST /init), which the
// daemon's proxy never forwards from outside.
//
// # Guarantees
//
//   - A pooled sandbox has run nothing but its agent; it is handed out once.
//   - Pooled sandboxes are the backend's like any other: Cleanup after a
//     crash removes them, and Close kills them.
//   - A Create the pool cannot serve goes straight to the backend.
package warm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
)

// Options configures a Pool.
type Options struct {
	// Backend makes the sandboxes. Required.
	Backend isolation.Backend
	// Size is how many started sandboxes to keep per (template, limits).
	// Zero disables pooling.
	Size int
	// Idle is how long a key may go unasked before its pool is drained;
	// zero means 10 minutes.
	Idle time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

type key struct {
	rootFS string
	limits isolation.Limits
}

type bucket struct {
	ready    []isolation.Sandbox
	filling  int
	lastUsed time.Time
}

// Pool is a pooling isolation.Backend.
type Pool struct {
	opts Options
	log  *slog.Logger

	mu sync.Mutex
	// +checklocks:mu
	buckets map[key]*bucket
	// +checklocks:mu
	closed bool

	wg   sync.WaitGroup
	stop chan struct{}
}

var _ isolation.Backend = (*Pool)(nil)

// New returns a Pool over opts.Backend.
func New(opts Options) *Pool {
	if opts.Idle == 0 {
		opts.Idle = 10 * time.Minute
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Pool{opts: opts, log: log, buckets: map[key]*bucket{}, stop: make(chan struct{})}
	if opts.Size > 0 {
		p.wg.Add(1)
		go p.janitor()
	}
	return p
}

// Name implements isolation.Backend.
func (p *Pool) Name() string { return p.opts.Backend.Name() }

// Cleanup implements isolation.Backend.
func (p *Pool) Cleanup(ctx context.Context) ([]string, error) {
	return p.opts.Backend.Cleanup(ctx)
}

// Create implements isolation.Backend.
func (p *Pool) Create(ctx context.Context, spec isolation.Spec) (isolation.Sandbox, error) {
	if p.opts.Size <= 0 || spec.ID != "" || len(spec.Binds) > 0 {
		return p.opts.Backend.Create(ctx, spec)
	}
	k := key{rootFS: spec.RootFS, limits: spec.Limits}
	for {
		sb := p.take(k)
		if sb == nil {
			break
		}
		// A pooled sandbox was started with the deny-all network; it takes
		// the request's policy before anything of the request runs.
		if setter, ok := sb.(isolation.EgressSetter); ok {
			setter.SetEgress(spec.Egress)
		} else if spec.Egress != nil {
			sb.Kill(context.WithoutCancel(ctx))
			break
		}
		if err := configure(ctx, sb, spec.Agent); err != nil {
			// A pooled sandbox that does not take its configuration is
			// not handed out.
			p.log.WarnContext(ctx, "discarding a pooled sandbox", "sandbox_id", sb.ID(), "err", err)
			sb.Kill(context.WithoutCancel(ctx))
			continue
		}
		return sb, nil
	}
	return p.opts.Backend.Create(ctx, spec)
}

// Prewarm starts filling the pool for a template and limits before the
// first request for them.
func (p *Pool) Prewarm(rootFS string, limits isolation.Limits) {
	if p.opts.Size <= 0 {
		return
	}
	if sb := p.take(key{rootFS: rootFS, limits: limits}); sb != nil {
		p.mu.Lock()
		b := p.buckets[key{rootFS: rootFS, limits: limits}]
		b.ready = append(b.ready, sb) // not handed out: put it back
		p.mu.Unlock()
	}
}

// WaitReady blocks until the pool for a template and limits holds a
// started sandbox (benchmarks use it to time only the hand-out).
func (p *Pool) WaitReady(ctx context.Context, rootFS string, limits isolation.Limits) error {
	k := key{rootFS: rootFS, limits: limits}
	for {
		p.mu.Lock()
		b := p.buckets[k]
		ready := b != nil && len(b.ready) > 0
		p.mu.Unlock()
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// take hands out a ready sandbox for k, if any, and schedules refills.
func (p *Pool) take(k key) isolation.Sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	b := p.buckets[k]
	if b == nil {
		b = &bucket{}
		p.buckets[k] = b
	}
	b.lastUsed = time.Now()
	var sb isolation.Sandbox
	for len(b.ready) > 0 && sb == nil {
		sb = b.ready[0]
		b.ready = b.ready[1:]
		select {
		case <-sb.Done(): // died while waiting
			sb = nil
		default:
		}
	}
	for len(b.ready)+b.filling < p.opts.Size {
		b.filling++
		p.wg.Add(1)
		go p.fill(k, b)
	}
	return sb
}

// refillDelay is how long a refill waits after a hand-out: starting a
// sandbox takes tens of milliseconds of CPU, which on a small machine would
// otherwise slow the very sandbox just handed out.
const refillDelay = 25 * time.Millisecond

// fill starts one sandbox for bucket b.
func (p *Pool) fill(k key, b *bucket) {
	defer p.wg.Done()
	select {
	case <-time.After(refillDelay):
	case <-p.stop:
		p.mu.Lock()
		b.filling--
		p.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := p.opts.Backend.Create(ctx, isolation.Spec{RootFS: k.rootFS, Limits: k.limits})
	p.mu.Lock()
	b.filling--
	if err == nil && !p.closed {
		b.ready = append(b.ready, sb)
		sb = nil
	}
	p.mu.Unlock()
	if err != nil {
		p.log.Warn("starting a pooled sandbox", "err", err)
		return
	}
	if sb != nil { // closed meanwhile
		sb.Kill(ctx)
	}
}

// janitor drains the pools of keys nobody asked for lately.
func (p *Pool) janitor() {
	defer p.wg.Done()
	t := time.NewTicker(p.opts.Idle / 4)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		var idle []isolation.Sandbox
		p.mu.Lock()
		for k, b := range p.buckets {
			if time.Since(b.lastUsed) > p.opts.Idle && b.filling == 0 {
				idle = append(idle, b.ready...)
				delete(p.buckets, k)
			}
		}
		p.mu.Unlock()
		for _, sb := range idle {
			sb.Kill(context.Background())
		}
	}
}

// Close kills every pooled sandbox and stops refilling. Sandboxes handed
// out stay the caller's.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var all []isolation.Sandbox
	for _, b := range p.buckets {
		all = append(all, b.ready...)
		b.ready = nil
	}
	p.mu.Unlock()
	close(p.stop)
	var errs []error
	for _, sb := range all {
		errs = append(errs, sb.Kill(ctx))
	}
	p.wg.Wait()
	return errors.Join(errs...)
}

// configure hands the agent its configuration.
func configure(ctx context.Context, sb isolation.Sandbox, cfg isolation.AgentConfig) error {
	body, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return sb.DialAgent(ctx) },
		DisableKeepAlives: true,
	}}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://agent/init", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("configuring agent: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("configuring agent: status %d", resp.StatusCode)
	}
	return nil
}
