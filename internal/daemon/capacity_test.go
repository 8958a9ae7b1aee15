package daemon

import (
	"testing"

	"github.com/fencesandbox/fence/internal/capacity"
)

// TestLeaseCapacity: a node advertises its --max-sandboxes unless the
// host's limits hold fewer more sandboxes than that leaves.
func TestLeaseCapacity(t *testing.T) {
	for _, c := range []struct {
		max, running int
		left         int64
		known        bool
		want         int
	}{
		{max: 1000, running: 10, left: 5000, known: true, want: 1000},
		{max: 1000, running: 10, left: 90, known: true, want: 100},
		{max: 1000, running: 600, left: 0, known: true, want: 600},
		{max: 1000, running: 10, known: false, want: 1000},
	} {
		if got := leaseCapacity(c.max, c.running, capacity.Status{Sandboxes: c.left}, c.known); got != c.want {
			t.Errorf("leaseCapacity(max %d, running %d, left %d, %v) = %d, want %d", c.max, c.running, c.left, c.known, got, c.want)
		}
	}
}
