package tenancy

import (
	"math"
	"strings"
	"time"
)

// bucket is a token bucket of one key's requests.
type bucket struct {
	tokens float64
	at     time.Time
}

// RateDecision is the answer of Allow: whether the request may go, and
// what the RateLimit-* and Retry-After headers say.
type RateDecision struct {
	Allowed bool
	// Limited is false when the team has no request rate limit: no
	// headers are due.
	Limited   bool
	Limit     int           // the burst
	Remaining int           // requests left at once after this one
	Reset     time.Duration // until the bucket is full again
	// RetryAfter is the wait until one request is allowed (refusals
	// only), at least one second.
	RetryAfter time.Duration
}

// burstOf is the size of l's buckets: Burst, else one second of
// requests, at least one.
func burstOf(l Limits) int {
	if l.Burst > 0 {
		return l.Burst
	}
	return max(1, int(math.Ceil(l.RequestsPerSecond)))
}

// minPrune is the number of buckets under which none is pruned.
const minPrune = 1024

// pruneLocked drops, once there are twice as many buckets as after the
// last pruning, the buckets full again by now: a bucket made anew is
// full, so nothing changes for their keys, and keys no longer used (a
// revoked one) hold no memory.
//
// +checklocks:q.mu
func (q *Quotas) pruneLocked(now time.Time) {
	if len(q.buckets) < max(minPrune, q.pruneAt) {
		return
	}
	for key, b := range q.buckets {
		team, _, _ := strings.Cut(key, "\x00")
		l := q.limitsLocked(team)
		if l.RequestsPerSecond <= 0 || b.tokens+now.Sub(b.at).Seconds()*l.RequestsPerSecond >= float64(burstOf(l)) {
			delete(q.buckets, key)
		}
	}
	q.pruneAt = 2 * len(q.buckets)
}

// Allow takes one request of p's key from its token bucket (the team's
// RequestsPerSecond and Burst; a Burst of 0 is one second of requests,
// at least one), at now. A team without a rate limit is always allowed.
func (q *Quotas) Allow(p Principal, now time.Time) RateDecision {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.limitsLocked(p.Team)
	if l.RequestsPerSecond <= 0 {
		return RateDecision{Allowed: true}
	}
	burst := burstOf(l)
	key := p.Team + "\x00" + p.KeyID
	b := q.buckets[key]
	if b == nil {
		q.pruneLocked(now)
		b = &bucket{tokens: float64(burst), at: now}
		q.buckets[key] = b
	}
	if el := now.Sub(b.at).Seconds(); el > 0 {
		b.tokens = math.Min(float64(burst), b.tokens+el*l.RequestsPerSecond)
		b.at = now
	}
	if b.tokens > float64(burst) {
		b.tokens = float64(burst) // the limits were lowered meanwhile
	}
	d := RateDecision{Limited: true, Limit: burst}
	if b.tokens >= 1 {
		b.tokens--
		d.Allowed = true
	} else {
		wait := time.Duration((1 - b.tokens) / l.RequestsPerSecond * float64(time.Second))
		d.RetryAfter = max(time.Second, wait.Round(time.Second))
		if d.RetryAfter < wait {
			d.RetryAfter += time.Second
		}
	}
	d.Remaining = int(b.tokens)
	d.Reset = time.Duration((float64(burst) - b.tokens) / l.RequestsPerSecond * float64(time.Second))
	return d
}
