package fake_test

import (
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
)

func TestConformance(t *testing.T) {
	host := fake.NewHost()
	isolationtest.Run(t, func(t *testing.T) isolation.Backend {
		return fake.New(fake.Options{Host: host, RequireRootFS: true})
	}, t.TempDir())
	if got := host.Running(); len(got) != 0 {
		t.Errorf("Running() after the suite = %v, want none", got)
	}
}
