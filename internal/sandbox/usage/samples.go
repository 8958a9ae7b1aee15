package usage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
)

// maxSamples bounds the resource history kept per sandbox (an hour at the
// default interval).
const maxSamples = 720

// Sample is one reading of a sandbox's resource use.
type Sample struct {
	At    time.Time
	Stats isolation.Stats
	// EgressOut and EgressIn are the bytes the sandbox's flows sent and
	// received up to this reading, counted as each flow ends.
	EgressOut, EgressIn int64
}

// Reader reads one live sandbox's resource use; the core implements it
// for each live sandbox, which keeps its readings in a Ring.
type Reader interface {
	// Read takes a reading as of now, keeps it and counts it in the
	// sandbox's Acc; ctx bounds it (the caller gives it a deadline). An
	// error wrapping isolation.ErrNotFound means the sandbox is gone.
	Read(ctx context.Context, now time.Time) (Sample, error)
	// Each calls f with every reading kept, oldest first.
	Each(f func(Sample))
}

// Ring keeps a sandbox's last maxSamples readings compactly: the limits
// are the sandbox's and do not change, so only what varies is stored (36
// bytes a reading instead of 80), and the oldest is overwritten in place.
// It is not safe for concurrent use: its owner (the core's record of the
// sandbox) guards it, as it does the sandbox's Acc.
type Ring struct {
	buf              []compactSample
	next             int // where the next reading goes once buf is full
	memLimit, dskLim int64
}

type compactSample struct {
	at        int64 // Unix nanoseconds, UTC
	cpu       int64 // nanoseconds
	mem, disk int64
	out, in   int64 // egress bytes so far
	pids      int32
}

// Add keeps s, dropping the oldest reading when the ring is full.
func (r *Ring) Add(s Sample) {
	c := compactSample{at: s.At.UnixNano(), cpu: int64(s.Stats.CPUUsage), mem: s.Stats.MemoryBytes,
		disk: s.Stats.DiskBytes, out: s.EgressOut, in: s.EgressIn, pids: int32(min(s.Stats.Pids, 1<<31-1))}
	r.memLimit, r.dskLim = s.Stats.MemoryLimit, s.Stats.DiskLimit
	if len(r.buf) < maxSamples {
		r.buf = append(r.buf, c)
		return
	}
	r.buf[r.next] = c
	r.next = (r.next + 1) % maxSamples
}

// Each calls f with every reading, oldest first.
func (r *Ring) Each(f func(Sample)) {
	for i := range r.buf {
		c := r.buf[(r.next+i)%len(r.buf)]
		f(Sample{At: time.Unix(0, c.at).UTC(), Stats: isolation.Stats{
			CPUUsage: time.Duration(c.cpu), MemoryBytes: c.mem, MemoryLimit: r.memLimit,
			DiskBytes: c.disk, DiskLimit: r.dskLim, Pids: int64(c.pids),
		}, EgressOut: c.out, EgressIn: c.in})
	}
}

// ReadTimeout bounds one reading of a sandbox's resource use that is
// taken alone (Metrics, a kill's last reading).
const ReadTimeout = 2 * time.Second

// Sample reads every live sandbox's resource use each interval, for
// E2B's metrics over a time range (Metrics) and the usage figures, until
// stop is closed. The readings of one round share one deadline, the
// interval (the next round is due then), rather than a context and a
// timer each: their cost is paid once per sandbox alive.
func (m *Meter) Sample(stop <-chan struct{}, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		m.sampleRound(every)
	}
}

// sampleRound takes one reading of every live sandbox, all within d.
func (m *Meter) sampleRound(d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for _, r := range m.live.Readers() {
		r.Read(ctx, m.now())
	}
}

// Metrics returns the resource readings of live sandbox id taken in
// [start, end] (zero times leave that side open), oldest first. When none
// was taken in the range and end is open or not past, a reading taken
// now is returned. A sandbox that is not live is an error wrapping
// api.ErrNotFound.
func (m *Meter) Metrics(ctx context.Context, id string, start, end time.Time) ([]Sample, error) {
	r, err := m.live.Reader(id)
	if err != nil {
		return nil, err
	}
	var out []Sample
	r.Each(func(s Sample) {
		if (start.IsZero() || !s.At.Before(start)) && (end.IsZero() || !s.At.After(end)) {
			out = append(out, s)
		}
	})
	if len(out) == 0 && (end.IsZero() || !m.now().After(end)) {
		rctx, cancel := context.WithTimeout(ctx, ReadTimeout)
		s, err := r.Read(rctx, m.now())
		cancel()
		if errors.Is(err, isolation.ErrNotFound) {
			return nil, fmt.Errorf("sandbox %q not found: %w", id, api.ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("reading stats of sandbox %s: %w", id, err)
		}
		out = append(out, s)
	}
	return out, nil
}
