package multi_test

import (
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/isolation/multi"
)

// TestConformance runs the suites a router's capabilities allow on a
// router of two fake backends, one of which keeps its paused sandboxes.
func TestConformance(t *testing.T) {
	host, kept := fake.NewHost(), fake.NewHost()
	isolationtest.RunAll(t, func(t *testing.T) isolation.Backend {
		b, err := multi.New(fake.New(fake.Options{Host: host, RequireRootFS: true}),
			fake.NewKeeping(fake.Options{Name: "kept", Host: kept, RequireRootFS: true}))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}, t.TempDir())
}
