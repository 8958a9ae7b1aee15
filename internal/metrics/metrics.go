// Package metrics counts what the daemon does and serves the counts in the
// Prometheus text exposition format (version 0.0.4).
//
// It is deliberately small: counters and gauges with a fixed, low-
// cardinality label set chosen by the code (never a sandbox ID, a name or
// anything a sandbox controls), safe for concurrent use, with no
// dependency beyond the standard library.
package metrics

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Registry holds metrics. The zero value is not usable; call New.
type Registry struct {
	mu sync.Mutex
	// +checklocks:mu
	metrics map[string]*family
}

type family struct {
	name, help, kind string
	mu               sync.Mutex
	series           map[string]*atomic.Int64 // rendered labels → value
	fn               func() int64             // for GaugeFunc and CounterFunc
	vec              func() []Value           // for CounterVecFunc
}

// Value is one series of a CounterVecFunc: its label pairs and value.
type Value struct {
	Labels []string
	V      float64
}

// CounterVecFunc registers a counter whose series fn reports at scrape
// time (fractional values allowed); no series may ever decrease, and the
// labels must have a bounded set of values.
func (r *Registry) CounterVecFunc(name, help string, fn func() []Value) {
	f := r.family(name, help, "counter")
	f.mu.Lock()
	f.vec = fn
	f.mu.Unlock()
}

// GaugeVecFunc registers a gauge whose series fn reports at scrape time;
// the labels must have a bounded set of values.
func (r *Registry) GaugeVecFunc(name, help string, fn func() []Value) {
	f := r.family(name, help, "gauge")
	f.mu.Lock()
	f.vec = fn
	f.mu.Unlock()
}

// New returns an empty Registry.
func New() *Registry { return &Registry{metrics: map[string]*family{}} }

func (r *Registry) family(name, help, kind string) *family {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.metrics[name]
	if f == nil {
		f = &family{name: name, help: help, kind: kind, series: map[string]*atomic.Int64{}}
		r.metrics[name] = f
	}
	return f
}

// Counter is a monotonically increasing count, one series per label set.
type Counter struct{ f *family }

// Counter returns the counter name, registering it on first use.
func (r *Registry) Counter(name, help string) Counter {
	return Counter{r.family(name, help, "counter")}
}

// Add adds n to the series with the given label pairs ("k", "v", …).
func (c Counter) Add(n int64, labels ...string) {
	key := render(labels)
	c.f.mu.Lock()
	v := c.f.series[key]
	if v == nil {
		v = new(atomic.Int64)
		c.f.series[key] = v
	}
	c.f.mu.Unlock()
	v.Add(n)
}

// GaugeFunc registers a gauge whose value fn reports at scrape time.
func (r *Registry) GaugeFunc(name, help string, fn func() int64) {
	f := r.family(name, help, "gauge")
	f.mu.Lock()
	f.fn = fn
	f.mu.Unlock()
}

// CounterFunc registers a counter whose value fn reports at scrape time;
// fn must never decrease.
func (r *Registry) CounterFunc(name, help string, fn func() int64) {
	f := r.family(name, help, "counter")
	f.mu.Lock()
	f.fn = fn
	f.mu.Unlock()
}

func render(labels []string) string {
	if len(labels) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i+1 < len(labels); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		v := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(labels[i+1])
		fmt.Fprintf(&b, "%s=\"%s\"", labels[i], v)
	}
	b.WriteByte('}')
	return b.String()
}

// WriteTo writes every metric in the text exposition format, sorted.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	r.mu.Lock()
	fams := make([]*family, 0, len(r.metrics))
	for _, f := range r.metrics {
		fams = append(fams, f)
	}
	r.mu.Unlock()
	slices.SortFunc(fams, func(a, b *family) int { return strings.Compare(a.name, b.name) })
	var b strings.Builder
	for _, f := range fams {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.kind)
		f.mu.Lock()
		if f.fn != nil {
			fmt.Fprintf(&b, "%s %d\n", f.name, f.fn())
		}
		if f.vec != nil {
			vals := f.vec()
			lines := make([]string, 0, len(vals))
			for _, v := range vals {
				lines = append(lines, fmt.Sprintf("%s%s %s\n", f.name, render(v.Labels), strconv.FormatFloat(v.V, 'g', -1, 64)))
			}
			slices.Sort(lines)
			for _, l := range lines {
				b.WriteString(l)
			}
		}
		keys := make([]string, 0, len(f.series))
		for k := range f.series {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "%s%s %d\n", f.name, k, f.series[k].Load())
		}
		f.mu.Unlock()
	}
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

// Handler serves the registry.
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		r.WriteTo(w)
	})
}
