package usage

import (
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
)

// The ring keeps the newest maxSamples readings, oldest first, and gives
// them back as they were recorded.
func TestSampleRing(t *testing.T) {
	var r Ring
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	const n = maxSamples + 37
	for i := range n {
		r.Add(Sample{At: t0.Add(time.Duration(i) * time.Second), Stats: isolation.Stats{
			CPUUsage: time.Duration(i) * time.Millisecond, MemoryBytes: int64(i) << 10, MemoryLimit: 512 << 20,
			DiskBytes: int64(i), DiskLimit: 1 << 30, Pids: int64(i % 100),
		}})
	}
	var got []Sample
	r.Each(func(s Sample) { got = append(got, s) })
	if len(got) != maxSamples {
		t.Fatalf("%d samples kept, want %d", len(got), maxSamples)
	}
	for j, s := range got {
		i := n - maxSamples + j
		want := Sample{At: t0.Add(time.Duration(i) * time.Second), Stats: isolation.Stats{
			CPUUsage: time.Duration(i) * time.Millisecond, MemoryBytes: int64(i) << 10, MemoryLimit: 512 << 20,
			DiskBytes: int64(i), DiskLimit: 1 << 30, Pids: int64(i % 100),
		}}
		if !s.At.Equal(want.At) || s.Stats != want.Stats {
			t.Fatalf("sample %d = %+v, want %+v", j, s, want)
		}
	}
}
