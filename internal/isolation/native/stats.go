package native

import (
	"context"
	"fmt"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/quota"
)

// Stats implements isolation.Sandbox.
func (s *sandbox) Stats(ctx context.Context) (isolation.Stats, error) {
	// Usage, not Stats: the daemon reads every sandbox's use every few
	// seconds, a cost that grows with the sandboxes alive and is taken
	// from their creates; the limit is the sandbox's own.
	st, err := s.cg.Usage()
	if err != nil {
		return isolation.Stats{}, fmt.Errorf("reading cgroup stats: %w", err)
	}
	out := isolation.Stats{
		CPUUsage:    st.CPUUsage,
		MemoryBytes: st.MemoryBytes,
		MemoryLimit: s.limit.MemoryBytes,
		Pids:        st.Pids,
		DiskLimit:   s.limit.DiskBytes,
	}
	if s.diskFD >= 0 && s.b.lfs != nil {
		out.DiskBytes = s.b.lfs.usage(s.diskFD)
	} else if s.diskFD >= 0 {
		if u, err := quota.UsageFD(s.diskFD); err == nil {
			out.DiskBytes = u.Bytes
		}
	}
	return out, nil
}

// DescribeCgroups reports what the sandbox's cgroups hold now, on every
// hierarchy (cgroup.Group.Describe): for a reading of its use that looks
// wrong to explain itself.
func (s *sandbox) DescribeCgroups() string { return s.cg.Describe() }
