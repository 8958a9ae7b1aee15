package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
)

// maxSamples bounds the resource history kept per sandbox (an hour at the
// default interval).
const maxSamples = 720

// Sample is one reading of a sandbox's resource use.
type Sample struct {
	At    time.Time
	Stats isolation.Stats
}

// sampleRing keeps the last maxSamples readings compactly: the limits are
// the sandbox's and do not change, so only what varies is stored (36 bytes
// a reading instead of 80), and the oldest is overwritten in place.
type sampleRing struct {
	buf              []compactSample
	next             int // where the next reading goes once buf is full
	memLimit, dskLim int64
}

type compactSample struct {
	at        int64 // Unix nanoseconds, UTC
	cpu       int64 // nanoseconds
	mem, disk int64
	pids      int32
}

func (r *sampleRing) add(s Sample) {
	c := compactSample{at: s.At.UnixNano(), cpu: int64(s.Stats.CPUUsage), mem: s.Stats.MemoryBytes,
		disk: s.Stats.DiskBytes, pids: int32(min(s.Stats.Pids, 1<<31-1))}
	r.memLimit, r.dskLim = s.Stats.MemoryLimit, s.Stats.DiskLimit
	if len(r.buf) < maxSamples {
		r.buf = append(r.buf, c)
		return
	}
	r.buf[r.next] = c
	r.next = (r.next + 1) % maxSamples
}

// each calls f with every reading, oldest first.
func (r *sampleRing) each(f func(Sample)) {
	for i := range r.buf {
		c := r.buf[(r.next+i)%len(r.buf)]
		f(Sample{At: time.Unix(0, c.at).UTC(), Stats: isolation.Stats{
			CPUUsage: time.Duration(c.cpu), MemoryBytes: c.mem, MemoryLimit: r.memLimit,
			DiskBytes: c.disk, DiskLimit: r.dskLim, Pids: int64(c.pids),
		}})
	}
}

// sampler reads every running sandbox's resource use each interval, for
// E2B's metrics over a time range.
func (m *Manager) sampler() {
	t := time.NewTicker(m.sampleEvery)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.mu.Lock()
		entries := make([]*entry, 0, len(m.running))
		for _, e := range m.running {
			entries = append(entries, e)
		}
		m.mu.Unlock()
		for _, e := range entries {
			e.sample(m.now())
		}
	}
}

// sample records one reading of e's resource use at now.
func (e *entry) sample(now time.Time) (Sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := e.sb().Stats(ctx)
	if err != nil {
		return Sample{}, err
	}
	s := Sample{At: now.UTC(), Stats: st}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.samples.add(s)
	e.use.Add(now, st.CPUUsage, st.MemoryBytes)
	return s, nil
}

// Metrics returns the resource readings of a running sandbox taken in
// [start, end] (zero times leave that side open), oldest first. When none
// was taken in the range and end is open or not past, a reading taken
// now is returned.
func (m *Manager) Metrics(ctx context.Context, id string, start, end time.Time) ([]Sample, error) {
	e, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	var out []Sample
	e.samples.each(func(s Sample) {
		if (start.IsZero() || !s.At.Before(start)) && (end.IsZero() || !s.At.After(end)) {
			out = append(out, s)
		}
	})
	e.mu.Unlock()
	if len(out) == 0 && (end.IsZero() || !m.now().After(end)) {
		s, err := e.sample(m.now())
		if errors.Is(err, isolation.ErrNotFound) {
			return nil, notFound(id)
		}
		if err != nil {
			return nil, fmt.Errorf("reading stats of sandbox %s: %w", id, err)
		}
		out = append(out, s)
	}
	return out, nil
}
