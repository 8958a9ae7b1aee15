package cluster

import (
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
)

// TestNamingConformance runs the suites the naming wrapper's capabilities
// allow (those of the backend it wraps) on the wrapper over a fake backend
// that keeps its paused sandboxes.
func TestNamingConformance(t *testing.T) {
	host := fake.NewHost()
	isolationtest.RunAll(t, func(t *testing.T) isolation.Backend {
		return NamingBackend(fake.NewKeeping(fake.Options{Host: host, RequireRootFS: true}), Tag("node-a"))
	}, t.TempDir())
}
