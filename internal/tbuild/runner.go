package tbuild

import "context"

// Runner is a Service with the sandboxes its builds run in: it runs
// builds (Trigger) and deletes templates (Delete), which must know the
// live sandboxes, and collects the layers none of them uses. The Service
// needs no sandboxes, so the sandbox manager that resolves templates
// through the Service's Catalog is made after the Service, and the
// Runner after both.
type Runner struct {
	*Service
	sandboxes Sandboxes
}

// NewRunner returns the runner of s's builds in sb's sandboxes, after a
// collection of the layers no live sandbox of sb uses. Without sb (nil),
// builds fail as unavailable and every deleted template's layers are
// kept.
func NewRunner(ctx context.Context, s *Service, sb Sandboxes) *Runner {
	s.collect(context.WithoutCancel(ctx), sb)
	s.mu.Lock()
	s.sandboxes = sb
	s.mu.Unlock()
	return &Runner{Service: s, sandboxes: sb}
}
