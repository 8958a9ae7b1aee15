package native

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencesandbox/fence/internal/cgroup"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/quota"
)

// statsRefresh is how long Stats reuses a sandbox's memory, task and
// disk readings while its CPU time does not move (cgroup.Group.UsageSince):
// it bounds how stale they are for a sandbox that ran nothing while the
// kernel reclaimed its memory.
const statsRefresh = time.Minute

// usageReading is a sandbox's last reading, which Stats reuses while the
// sandbox runs nothing.
type usageReading struct {
	mu sync.Mutex
	// +checklocks:mu
	cg cgroup.Stats
	// +checklocks:mu
	disk int64
	// +checklocks:mu
	full time.Time // when memory, tasks and disk were last read
	// cpu holds the cgroup's CPU time file open between readings; it is
	// closed before the cgroup is removed (closeUsage).
	cpu cgroup.HeldCPU
}

// diskReadings counts the readings of a writable layer's use, for tests.
var diskReadings atomic.Int64

// Stats implements isolation.Sandbox. The daemon reads every sandbox's
// use every few seconds, a cost that grows with the sandboxes alive and
// is taken from their creates, so an idle sandbox's reading reads one
// control file (its CPU time), held open between readings: while that
// does not move, its memory, tasks and disk are those of the last
// reading, read again at least every statsRefresh.
func (s *sandbox) Stats(ctx context.Context) (isolation.Stats, error) {
	u := &s.usage
	u.mu.Lock()
	defer u.mu.Unlock()
	prev := u.cg
	if time.Since(u.full) >= statsRefresh {
		prev = cgroup.Stats{}
	}
	// Usage, not Stats: the limit is the sandbox's own.
	st, ran, err := s.cg.UsageSinceHeld(&u.cpu, prev)
	if err != nil {
		return isolation.Stats{}, fmt.Errorf("reading cgroup stats: %w", err)
	}
	if ran {
		u.cg, u.disk, u.full = st, s.diskUsage(), time.Now()
	}
	return isolation.Stats{
		CPUUsage:    st.CPUUsage,
		MemoryBytes: st.MemoryBytes,
		MemoryLimit: s.limit.MemoryBytes,
		Pids:        st.Pids,
		DiskBytes:   u.disk,
		DiskLimit:   s.limit.DiskBytes,
	}, nil
}

// closeUsage lets go of the cgroup's CPU time file that Stats holds open,
// before the cgroup is removed.
func (s *sandbox) closeUsage() { s.usage.cpu.Close() }

// diskUsage reads the bytes used in the sandbox's writable layer (0 when
// it has none).
func (s *sandbox) diskUsage() int64 {
	if s.diskFD < 0 {
		return 0
	}
	diskReadings.Add(1)
	if s.b.lfs != nil {
		return s.b.lfs.usage(s.diskFD)
	}
	if u, err := quota.UsageFD(s.diskFD); err == nil {
		return u.Bytes
	}
	return 0
}

// DescribeCgroups reports what the sandbox's cgroups hold now, on every
// hierarchy (cgroup.Group.Describe): for a reading of its use that looks
// wrong to explain itself.
func (s *sandbox) DescribeCgroups() string { return s.cg.Describe() }
