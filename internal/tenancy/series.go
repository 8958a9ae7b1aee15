package tenancy

import (
	"slices"
	"sort"
	"time"
)

// The teams' metrics over time (E2B's team metrics): each team's number
// of running sandboxes at each change, and its starts (creates, forks
// and resumes admitted), for the last SeriesKeep, at most seriesMax
// entries of each; a restart starts afresh.

// SeriesKeep is how far back the teams' metrics go.
const SeriesKeep = 7*24*time.Hour + time.Hour

const seriesMax = 1 << 16

type point struct {
	at      int64 // unix nanoseconds
	running int
}

type teamSeries struct {
	points []point // changes of the running count, oldest first
	starts []int64 // unix nanoseconds, oldest first
	total  uint64  // starts since the daemon started (Prometheus)
}

// TeamMetric is one step of a team's metrics: E2B's TeamMetric.
type TeamMetric struct {
	Timestamp           time.Time `json:"timestamp"`
	TimestampUnix       int64     `json:"timestampUnix"`
	ConcurrentSandboxes int32     `json:"concurrentSandboxes"`
	SandboxStartRate    float64   `json:"sandboxStartRate"` // starts per second over the step
}

// +checklocks:q.mu
func (q *Quotas) seriesLocked(team string) *teamSeries {
	if q.series == nil {
		q.series = map[string]*teamSeries{}
	}
	s := q.series[team]
	if s == nil {
		s = &teamSeries{}
		q.series[team] = s
	}
	return s
}

// noteRunningLocked records team's running count after a change.
//
// +checklocks:q.mu
func (q *Quotas) noteRunningLocked(team string, running int) {
	s := q.seriesLocked(team)
	now := time.Now().UnixNano()
	if n := len(s.points); n > 0 && s.points[n-1].running == running {
		return
	}
	s.points = trim(append(s.points, point{now, running}), now, func(p point) int64 { return p.at }, true)
}

// noteStartLocked records a start of team's.
//
// +checklocks:q.mu
func (q *Quotas) noteStartLocked(team string) {
	s := q.seriesLocked(team)
	now := time.Now().UnixNano()
	s.total++
	s.starts = trim(append(s.starts, now), now, func(t int64) int64 { return t }, false)
}

// trim drops the entries older than SeriesKeep and over seriesMax; the
// last one dropped stays when keepBase (a point before the window is
// its first value).
func trim[T any](xs []T, now int64, at func(T) int64, keepBase bool) []T {
	cut := max(0, len(xs)-seriesMax)
	old := now - int64(SeriesKeep)
	for cut < len(xs)-1 && at(xs[cut]) < old && (!keepBase || at(xs[cut+1]) < old) {
		cut++
	}
	if cut == 0 {
		return xs
	}
	if cut > len(xs)/2 { // compact now and then, not at every append
		return slices.Clone(xs[cut:])
	}
	return xs[cut:]
}

// MetricStep is E2B's step of team metrics over a range of d.
func MetricStep(d time.Duration) time.Duration {
	switch {
	case d < time.Hour:
		return 5 * time.Second
	case d < 6*time.Hour:
		return 30 * time.Second
	case d < 12*time.Hour:
		return time.Minute
	case d < 24*time.Hour:
		return 2 * time.Minute
	case d < 7*24*time.Hour:
		return 5 * time.Minute
	}
	return 15 * time.Minute
}

// TeamMetrics returns team's metrics from start to end, one per step
// (MetricStep of the range), from the first the daemon knows of: each
// step's most running sandboxes and its starts per second. None when
// the team has had no sandbox since the daemon started.
func (q *Quotas) TeamMetrics(team string, start, end time.Time) []TeamMetric {
	step := MetricStep(end.Sub(start))
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.series[team]
	out := []TeamMetric{}
	if s == nil || (len(s.points) == 0 && len(s.starts) == 0) {
		return out
	}
	first := int64(1<<63 - 1)
	if len(s.points) > 0 {
		first = s.points[0].at
	}
	if len(s.starts) > 0 {
		first = min(first, s.starts[0])
	}
	from := start.Truncate(step)
	if f := time.Unix(0, first).Truncate(step); f.After(from) {
		from = f
	}
	if now := time.Now(); end.After(now) {
		end = now
	}
	for t := from; !t.After(end); t = t.Add(step) {
		lo, hi := t.UnixNano(), t.Add(step).UnixNano()
		out = append(out, TeamMetric{Timestamp: t.UTC(), TimestampUnix: t.Unix(),
			ConcurrentSandboxes: int32(maxRunning(s.points, lo, hi)),
			SandboxStartRate:    float64(countIn(s.starts, lo, hi)) / step.Seconds()})
	}
	return out
}

// maxRunning is the most running in [lo, hi): the value at lo and every
// change within.
func maxRunning(ps []point, lo, hi int64) int {
	i := sort.Search(len(ps), func(i int) bool { return ps[i].at >= lo })
	best := 0
	if i > 0 {
		best = ps[i-1].running
	}
	for ; i < len(ps) && ps[i].at < hi; i++ {
		best = max(best, ps[i].running)
	}
	return best
}

func countIn(ts []int64, lo, hi int64) int {
	a := sort.Search(len(ts), func(i int) bool { return ts[i] >= lo })
	b := sort.Search(len(ts), func(i int) bool { return ts[i] >= hi })
	return b - a
}

// TeamStarts returns each team's starts since the daemon started (the
// teams that had one).
func (q *Quotas) TeamStarts() map[string]uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := map[string]uint64{}
	for team, s := range q.series {
		if s.total > 0 {
			out[team] = s.total
		}
	}
	return out
}

// TeamUsages returns what each team's sandboxes take now (the teams
// with any).
func (q *Quotas) TeamUsages() map[string]Usage {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make(map[string]Usage, len(q.use))
	for team, u := range q.use {
		out[team] = *u
	}
	return out
}
