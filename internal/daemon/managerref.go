package daemon

import (
	"sync/atomic"

	"github.com/fencesandbox/fence/internal/sandbox"
)

// managerRef is the sandbox manager as the parts made before it see it:
// the flow recorder counts egress bytes with it. The recorder is an
// argument of the sandboxes' network fence, which sandbox.New takes, so
// it is made first and given this narrow view, which is bound to the
// manager exactly once, by the step that makes it, before any sandbox can
// be handed out. Until then usage is not counted: there is no sandbox for
// it to be about.
type managerRef struct {
	m atomic.Pointer[sandbox.Manager]
}

// bind points the ref at m; a second bind panics (one manager per daemon).
func (r *managerRef) bind(m *sandbox.Manager) {
	if !r.m.CompareAndSwap(nil, m) {
		panic("daemon: sandbox manager bound twice")
	}
}

// AddEgress counts a flow's bytes against sandbox id.
func (r *managerRef) AddEgress(id string, out, in int64) {
	if m := r.m.Load(); m != nil {
		m.Meter().AddEgress(id, out, in)
	}
}
