package netfence_test

import (
	"errors"
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netfence"
)

// A Net is what the isolation seam calls a Network, and a dial while no
// namespace is attached is the seam's "paused": the contract both sides
// share (package netattach) keeps them one, without netfence importing
// isolation.
func TestNetIsTheSeamsNetwork(t *testing.T) {
	var _ isolation.Network = (*netfence.Net)(nil)
	if !errors.Is(netfence.ErrNotAttached, isolation.ErrPaused) {
		t.Fatalf("ErrNotAttached (%v) does not wrap isolation.ErrPaused", netfence.ErrNotAttached)
	}
}
