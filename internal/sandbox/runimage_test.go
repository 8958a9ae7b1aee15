package sandbox

import (
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
)

// TestRunImageKey checks that a run image is shared only by creates made
// the same way: another environment, network, template root, backend or
// limit is another key; secrets or no start command, no key.
func TestRunImageKey(t *testing.T) {
	no := false
	spec := isolation.Spec{RootFS: "/t/a", Agent: isolation.AgentConfig{EnvVars: map[string]string{"A": "1"}}}
	rt := Runtime{StartCmd: "serve", ReadyCmd: "ready"}
	base := runImageKey(spec, rt, CreateRequest{}, nil)
	if base == "" || base != runImageKey(spec, rt, CreateRequest{}, nil) {
		t.Fatalf("runImageKey is %q, not stable", base)
	}
	with := func(f func(*isolation.Spec, *Runtime, *CreateRequest)) string {
		s, r, q := spec, rt, CreateRequest{}
		s.Agent.EnvVars = map[string]string{"A": "1"}
		f(&s, &r, &q)
		return runImageKey(s, r, q, nil)
	}
	tests := []struct {
		name string
		f    func(*isolation.Spec, *Runtime, *CreateRequest)
	}{
		{"env", func(s *isolation.Spec, _ *Runtime, _ *CreateRequest) { s.Agent.EnvVars["A"] = "2" }},
		{"user", func(s *isolation.Spec, _ *Runtime, _ *CreateRequest) { s.Agent.DefaultUser = "root" }},
		{"rootfs", func(s *isolation.Spec, _ *Runtime, _ *CreateRequest) { s.RootFS = "/t/b" }},
		{"backend", func(s *isolation.Spec, _ *Runtime, _ *CreateRequest) { s.Backend = "gvisor" }},
		{"memory", func(s *isolation.Spec, _ *Runtime, _ *CreateRequest) { s.Limits.MemoryBytes = 1 << 30 }},
		{"start command", func(_ *isolation.Spec, r *Runtime, _ *CreateRequest) { r.StartCmd = "other" }},
		{"internet", func(_ *isolation.Spec, _ *Runtime, q *CreateRequest) { q.AllowInternetAccess = &no }},
	}
	for _, tt := range tests {
		if k := with(tt.f); k == base || k == "" {
			t.Errorf("runImageKey with another %s = %q, want another key", tt.name, k)
		}
	}
	if k := runImageKey(spec, Runtime{}, CreateRequest{}, nil); k != "" {
		t.Errorf("runImageKey without a start command = %q, want none", k)
	}
	if k := runImageKey(spec, rt, CreateRequest{}, map[string]string{"TOKEN": "placeholder"}); k != "" {
		t.Errorf("runImageKey with bound secrets = %q, want none", k)
	}
}
