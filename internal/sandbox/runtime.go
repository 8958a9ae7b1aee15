package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/warm"
)

// Runtime is what a built template asks of each sandbox made from it: the
// agent's default user and workdir, and E2B's start and ready commands.
type Runtime struct {
	DefaultUser    string
	DefaultWorkdir string
	// Env holds the template's environment defaults (an image's ENV);
	// the create request's variables override them.
	Env map[string]string
	// StartCmd is started (bash -l -c, as the default user, in the default
	// workdir) at every sandbox start and left running.
	StartCmd string
	// ReadyCmd is run the same way until it exits 0; Create answers only
	// then. Empty with a StartCmd means nothing to wait for.
	ReadyCmd string
	// CPUs and MemoryMB are the size of the template's sandboxes when the
	// create request gives none; zero means the daemon's defaults.
	CPUs     float64
	MemoryMB int64
}

// Runtimer is implemented by Templates that know a template's Runtime
// (internal/tbuild's built templates).
type Runtimer interface {
	Runtime(name string) (Runtime, bool)
}

// readyCmdTimeout bounds the wait for a ready command (E2B's 10 minutes);
// readyCmdPoll is the longest pause between its runs.
const (
	readyCmdTimeout = 10 * time.Minute
	readyCmdPoll    = 2 * time.Second
)

// startRuntime starts rt's start command in box and waits for its ready
// command to pass. A start command that exits non-zero before then, or a
// ready command that never passes, is an error.
func (m *Manager) startRuntime(ctx context.Context, box isolation.Sandbox, template string, rt Runtime) error {
	if rt.StartCmd == "" && rt.ReadyCmd == "" {
		return nil
	}
	a := newAgentProcs(box)
	defer a.close()
	start := time.Now()
	var startDone <-chan struct{}
	var startProc *agentProc
	if rt.StartCmd != "" && m.startedAhead(ctx, a, template) {
		// A sandbox of a warm pool (WarmTarget) had its start command
		// started, and its ready command passed, before it was handed out;
		// the ready command is checked once more below.
	} else if rt.StartCmd != "" {
		// The start command outlives this call: its context is not ctx.
		p, err := a.start(context.WithoutCancel(ctx), rt.StartCmd, rt.DefaultUser, rt.DefaultWorkdir, startCmdTag)
		if err != nil {
			return fmt.Errorf("starting the start command of template %s: %w", template, err)
		}
		startProc, startDone = p, p.done
		defer p.close() // stops following it; the process runs on
	}
	if rt.ReadyCmd == "" {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, readyCmdTimeout)
	defer cancel()
	pause := 100 * time.Millisecond
	for {
		st, err := a.run(wctx, rt.ReadyCmd, rt.DefaultUser, rt.DefaultWorkdir)
		if err == nil && st.exited && st.code == 0 {
			m.log.DebugContext(ctx, "template ready command passed", "sandbox_id", box.ID(), "template", template,
				"waited", time.Since(start))
			return nil
		}
		select {
		case <-startDone:
			if st, err := startProc.wait(); err == nil && st.exited && st.code != 0 {
				return fmt.Errorf("template %s: start command failed: exit status %d", template, st.code)
			}
			startDone = nil
		default:
		}
		select {
		case <-wctx.Done():
			if errors.Is(wctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
				return fmt.Errorf("template %s: ready command timed out after %s", template, readyCmdTimeout)
			}
			return fmt.Errorf("waiting for the ready command of template %s: %w", template, ctx.Err())
		case <-time.After(pause):
		}
		pause = min(pause*2, readyCmdPoll)
	}
}

// startCmdTag tags the start command's process in the agent.
const startCmdTag = "start-cmd"

// startedAhead reports whether template's start command already runs in
// the sandbox behind a: only a template a warm pool prepares ahead of
// demand may have one (nothing of the request's has run in the sandbox
// yet, so the process list is the pool's doing).
func (m *Manager) startedAhead(ctx context.Context, a *agentProcs, template string) bool {
	if _, ok := m.warmTemplates.Load(template); !ok {
		return false
	}
	ok, err := a.tagged(ctx, startCmdTag)
	return err == nil && ok
}

// WarmTarget is the warm pool target that keeps sandboxes of template name
// started ahead of demand, as a create of it with no options would make
// them: its root, its size, its environment, user and workdir, and, when
// it has a start or ready command, a Prepare that starts the one and waits
// for the other. A create of the template with the same limits and no
// binds is then a hand-out: the request's environment and network are set
// in the running sandbox, whose start command (started with the
// template's environment alone, as a template's start command on E2B is
// run at build time) runs on.
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
	t := warm.Target{RootFS: rootfs, Limits: limits, Network: m.PoolNetwork(),
		Agent: isolation.AgentConfig{EnvVars: env, DefaultUser: rt.DefaultUser, DefaultWorkdir: rt.DefaultWorkdir}}
	if rt.StartCmd != "" || rt.ReadyCmd != "" {
		m.warmTemplates.Store(name, true)
		t.Prepare = func(ctx context.Context, sb isolation.Sandbox) error {
			return m.startRuntime(ctx, sb, name, rt)
		}
	}
	return t, nil
}
