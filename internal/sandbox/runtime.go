package sandbox

import (
	"fmt"
	"maps"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/warm"
	"github.com/fencesandbox/fence/internal/sandbox/startup"
)

// Runtime is what a built template asks of each sandbox made from it
// (startup.Runtime): the Manager's startup.Starter runs its start and
// ready commands in each new sandbox before Create answers.
type Runtime = startup.Runtime

// Runtimer is implemented by Templates that know a template's Runtime
// (the daemon's, over tbuild.Catalog: built templates and fence's own
// made from an image).
type Runtimer interface {
	Runtime(name string) (Runtime, bool)
}

// WarmTarget is the warm pool target that keeps sandboxes of template name
// started ahead of demand, as a create of it with no options would make
// them: its root, its size, its environment, user and workdir, and, when
// it has a start or ready command, a Prepare that starts the one and waits
// for the other (startup.Starter.Warm). A create of the template with the
// same limits and no binds is then a hand-out: the request's environment
// and network are set in the running sandbox, whose start command (started
// with the template's environment alone, as a template's start command on
// E2B is run at build time) runs on.
func (m *Manager) WarmTarget(name string) (warm.Target, error) {
	rootfs, err := m.templates.Resolve(name)
	if err != nil {
		return warm.Target{}, fmt.Errorf("resolving template %q: %w", name, err)
	}
	var rt Runtime
	if r, ok := m.templates.(Runtimer); ok {
		rt, _ = r.Runtime(name)
	}
	_, limits, err := validate(CreateRequest{TemplateID: name, CPUs: rt.CPUs, MemoryMB: rt.MemoryMB}, m.defaults, m.maxTimeout)
	if err != nil {
		return warm.Target{}, err
	}
	env := maps.Clone(m.caEnv)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, rt.Env)
	return warm.Target{RootFS: rootfs, Limits: limits, Network: m.fences.Pool(),
		Agent:   isolation.AgentConfig{EnvVars: env, DefaultUser: rt.DefaultUser, DefaultWorkdir: rt.DefaultWorkdir},
		Prepare: m.starts.Warm(name, rt)}, nil
}

// ReadyPorter is implemented by Templates that know which ports a sandbox
// of a template serves once started (the daemon's, over tbuild.Catalog:
// the code-interpreter template's server). Create waits for them
// (startup.WaitPorts).
type ReadyPorter interface {
	ReadyPorts(name string) []uint16
}
