package warm_test

import (
	"context"
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/isolation/warm"
)

// TestConformance runs the suites a pool's capabilities allow on a pool
// in front of the fake backend, keeping one sandbox of the suites' rootfs.
func TestConformance(t *testing.T) {
	host := fake.NewHost()
	rootfs := t.TempDir()
	isolationtest.RunAll(t, func(t *testing.T) isolation.Backend {
		p := warm.New(warm.Options{Backend: fake.NewKeeping(fake.Options{Host: host, RequireRootFS: true}), Size: 1})
		p.Start(warm.Target{RootFS: rootfs}, nil)
		t.Cleanup(func() { p.Close(context.Background()) })
		return p
	}, rootfs)
}
