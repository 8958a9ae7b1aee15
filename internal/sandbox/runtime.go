package sandbox

import (
	"context"
	"fmt"
	"maps"
	"net"

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
	t := warm.Target{RootFS: rootfs, Limits: limits, Network: m.fences.Pool(),
		Agent:   isolation.AgentConfig{EnvVars: env, DefaultUser: rt.DefaultUser, DefaultWorkdir: rt.DefaultWorkdir},
		Prepare: m.starts.Warm(name, rt)}
	if rp, ok := m.templates.(ReadyPorter); ok {
		if ports := rp.ReadyPorts(name); len(ports) > 0 {
			t.Prepare = waitingPorts(m, name, ports, t.Prepare)
			// Its services (the code interpreter's kernel) start with the
			// pool's environment and would not see another.
			t.SameEnv = true
		}
	}
	return t, nil
}

// waitingPorts is prepare (nil for none) after the wait for a pooled
// sandbox of template name to serve its ready ports: a sandbox counts as
// ready in the pool once its services are (the code interpreter's kernel
// started and warm).
func waitingPorts(m *Manager, name string, ports []uint16, prepare func(context.Context, isolation.Sandbox) error) func(context.Context, isolation.Sandbox) error {
	return func(ctx context.Context, sb isolation.Sandbox) error {
		if err := startup.WaitPorts(ctx, m.log, sb.ID(), func(ctx context.Context, port uint16) (net.Conn, error) {
			return m.fences.Dial(ctx, sb.ID(), port)
		}, name, ports); err != nil {
			return err
		}
		if prepare == nil {
			return nil
		}
		return prepare(ctx, sb)
	}
}

// ReadyPorter is implemented by Templates that know which ports a sandbox
// of a template serves once started (the daemon's, over tbuild.Catalog:
// the code-interpreter template's server). Create waits for them
// (startup.WaitPorts).
type ReadyPorter interface {
	ReadyPorts(name string) []uint16
}
