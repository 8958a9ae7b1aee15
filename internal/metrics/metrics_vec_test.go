package metrics

import (
	"strings"
	"testing"
)

// TestCounterVecFunc: each series is rendered with its labels and a
// fractional value, sorted.
func TestCounterVecFunc(t *testing.T) {
	r := New()
	r.CounterVecFunc("fence_x_total", "X.", func() []Value {
		return []Value{{Labels: []string{"key", "b"}, V: 1.5}, {Labels: []string{"key", `a"`}, V: 2}}
	})
	var b strings.Builder
	r.WriteTo(&b)
	want := "# HELP fence_x_total X.\n# TYPE fence_x_total counter\nfence_x_total{key=\"a\\\"\"} 2\nfence_x_total{key=\"b\"} 1.5\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
