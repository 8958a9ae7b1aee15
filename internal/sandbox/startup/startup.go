// Package startup runs what a template asks of each sandbox made from it
// before the sandbox is handed out: E2B's start and ready commands, the
// wait for its ready ports, and the run images that let later sandboxes
// of the template skip the start command.
//
// Guarantees:
//   - A start command is started once per sandbox and left running; its
//     following stops when Start returns, never the process.
//   - Start returns nil only once the ready command exited 0 (or there is
//     none); a start command that exits non-zero first, or a ready
//     command that does not pass within 10 minutes, is an error.
//   - A sandbox of a warm pool (Warm) whose start command already runs is
//     not given a second one.
//   - A run image is used only by creates whose key (computed by the
//     core) is the image's; one that fails to boot is dropped.
//
// The package reaches the sandboxes' agents only through Agent, which the
// daemon wires (internal/daemon: the envd client over the sandbox's own
// connection), and the core's layers only through Layers. It imports
// nothing of internal/sandbox.
package startup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
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

// Command is a Runtime command as the agent starts it: bash -l -c Cmd,
// as User (the agent's default when ""), in Cwd (the default when ""),
// with no standard input, its process tagged Tag when not "".
type Command struct {
	Cmd, User, Cwd, Tag string
}

// Exit is how a process ended.
type Exit struct {
	Exited bool // it exited (rather than being killed by a signal)
	Code   int
}

// Agent runs commands in one sandbox through its agent (the envd
// protocol). Errors of the protocol carry the api sentinel for their
// code (api.RPCError).
type Agent interface {
	// Start starts c and returns once the agent reported the process
	// started; it is followed until it ends, ctx ends or Close is called.
	Start(ctx context.Context, c Command) (Proc, error)
	// Tagged reports whether a process tagged tag runs in the sandbox.
	Tagged(ctx context.Context, tag string) (bool, error)
	// Close drops the idle connections to the agent; processes run on.
	Close()
}

// Proc is a process an Agent started.
type Proc interface {
	// Done is closed when following the process stopped.
	Done() <-chan struct{}
	// Wait waits until following stopped and returns how the process
	// ended; an error means the stream broke before the agent reported
	// the end. A non-zero exit is not an error.
	Wait() (Exit, error)
	// Close stops following the process, which runs on.
	Close()
}

// Connect returns an Agent of the sandbox box.
type Connect func(box isolation.Sandbox) Agent

// readyCmdTimeout bounds the wait for a ready command (E2B's 10 minutes);
// readyCmdPoll is the longest pause between its runs.
const (
	readyCmdTimeout = 10 * time.Minute
	readyCmdPoll    = 2 * time.Second
)

// startCmdTag tags the start command's process in the agent.
const startCmdTag = "start-cmd"

// Starter starts templates' runtimes in sandboxes.
type Starter struct {
	connect Connect
	log     *slog.Logger
	// warm holds the templates a warm pool prepares (Warm).
	warm sync.Map // string → bool
}

// NewStarter returns a Starter reaching sandboxes' agents with connect;
// a nil connect fails every template that has a start or ready command.
// A nil log discards.
func NewStarter(connect Connect, log *slog.Logger) *Starter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Starter{connect: connect, log: log}
}

// errNoAgent is Start's error when the Starter cannot reach agents.
var errNoAgent = errors.New("no agent client to run the template's commands")

// Start starts rt's start command in box and waits for its ready command
// to pass. A start command that exits non-zero before then, or a ready
// command that never passes, is an error.
func (s *Starter) Start(ctx context.Context, box isolation.Sandbox, template string, rt Runtime) error {
	if rt.StartCmd == "" && rt.ReadyCmd == "" {
		return nil
	}
	if s.connect == nil {
		return fmt.Errorf("template %s: %w", template, errNoAgent)
	}
	a := s.connect(box)
	defer a.Close()
	start := time.Now()
	var startDone <-chan struct{}
	var startProc Proc
	if rt.StartCmd != "" && s.startedAhead(ctx, a, template) {
		// A sandbox of a warm pool (Warm) had its start command started,
		// and its ready command passed, before it was handed out; the
		// ready command is checked once more below.
	} else if rt.StartCmd != "" {
		// The start command outlives this call: its context is not ctx.
		p, err := a.Start(context.WithoutCancel(ctx), Command{Cmd: rt.StartCmd, User: rt.DefaultUser, Cwd: rt.DefaultWorkdir, Tag: startCmdTag})
		if err != nil {
			return fmt.Errorf("starting the start command of template %s: %w", template, err)
		}
		startProc, startDone = p, p.Done()
		defer p.Close() // stops following it; the process runs on
	}
	if rt.ReadyCmd == "" {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, readyCmdTimeout)
	defer cancel()
	pause := 100 * time.Millisecond
	for {
		st, err := run(wctx, a, Command{Cmd: rt.ReadyCmd, User: rt.DefaultUser, Cwd: rt.DefaultWorkdir})
		if err == nil && st.Exited && st.Code == 0 {
			s.log.DebugContext(ctx, "template ready command passed", "sandbox_id", box.ID(), "template", template,
				"waited", time.Since(start))
			return nil
		}
		select {
		case <-startDone:
			if st, err := startProc.Wait(); err == nil && st.Exited && st.Code != 0 {
				return fmt.Errorf("template %s: start command failed: exit status %d", template, st.Code)
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

// run starts c and waits for it to end.
func run(ctx context.Context, a Agent, c Command) (Exit, error) {
	p, err := a.Start(ctx, c)
	if err != nil {
		return Exit{}, err
	}
	return p.Wait()
}

// startedAhead reports whether template's start command already runs in
// the sandbox behind a: only a template a warm pool prepares ahead of
// demand may have one (nothing of the request's has run in the sandbox
// yet, so the process list is the pool's doing).
func (s *Starter) startedAhead(ctx context.Context, a Agent, template string) bool {
	if _, ok := s.warm.Load(template); !ok {
		return false
	}
	ok, err := a.Tagged(ctx, startCmdTag)
	return err == nil && ok
}

// Warm returns what a warm pool of template name runs in each sandbox it
// starts ahead of demand (warm.Target.Prepare): rt's start command,
// started with the template's environment alone, and the wait for its
// ready command; nil when rt has neither. A later Start of the template
// in a sandbox so prepared leaves its start command running.
func (s *Starter) Warm(name string, rt Runtime) func(context.Context, isolation.Sandbox) error {
	if rt.StartCmd == "" && rt.ReadyCmd == "" {
		return nil
	}
	s.warm.Store(name, true)
	return func(ctx context.Context, sb isolation.Sandbox) error {
		return s.Start(ctx, sb, name, rt)
	}
}
