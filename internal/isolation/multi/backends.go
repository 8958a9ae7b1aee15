package multi

import (
	"slices"

	"github.com/fencesandbox/fence/internal/isolation"
)

// Backends returns the backends routed to, the default first.
func (b *Backend) Backends() []isolation.Backend { return slices.Clone(b.all) }
