package fake_test

import (
	"errors"
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
)

func TestConformance(t *testing.T) {
	host := fake.NewHost()
	isolationtest.RunAll(t, func(t *testing.T) isolation.Backend {
		return fake.New(fake.Options{Host: host, RequireRootFS: true})
	}, t.TempDir())
	if got := host.Running(); len(got) != 0 {
		t.Errorf("Running() after the suite = %v, want none", got)
	}
}

func TestKeepingConformance(t *testing.T) {
	host := fake.NewHost()
	isolationtest.RunAll(t, func(t *testing.T) isolation.Backend {
		return fake.NewKeeping(fake.Options{Host: host, RequireRootFS: true})
	}, t.TempDir())
	if got := host.Running(); len(got) != 0 {
		t.Errorf("Running() after the suite = %v, want none", got)
	}
}

func TestPauseResume(t *testing.T) {
	b := fake.New(fake.Options{})
	s, err := b.Create(t.Context(), isolation.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Kill(t.Context())
	p := s.(isolation.Pauser)
	if err := p.Pause(t.Context()); err != nil {
		t.Fatalf("Pause() = %v", err)
	}
	if c, err := s.DialAgent(t.Context()); !errors.Is(err, isolation.ErrPaused) {
		if c != nil {
			c.Close()
		}
		t.Errorf("DialAgent() while paused = %v, want ErrPaused", err)
	}
	if paused, n := s.(*fake.Sandbox).Paused(); !paused || n != 1 {
		t.Errorf("Paused() = %v, %d; want true, 1", paused, n)
	}
	if err := p.Resume(t.Context()); err != nil {
		t.Fatalf("Resume() = %v", err)
	}
	c, err := s.DialAgent(t.Context())
	if err != nil {
		t.Fatalf("DialAgent() after Resume = %v", err)
	}
	c.Close()
	s.Kill(t.Context())
	if err := p.Pause(t.Context()); !errors.Is(err, isolation.ErrNotFound) {
		t.Errorf("Pause() after Kill = %v, want ErrNotFound", err)
	}
}
