package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/fencesandbox/fence/internal/bench"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/template"
)

// LocalOptions configures a sandbox started without a daemon.
type LocalOptions struct {
	DataDir      string
	TemplatesDir string // empty means DataDir/templates
	Template     string
	Limits       isolation.Limits
	Binds        []isolation.Bind
	Agent        isolation.AgentConfig
	// Recorder receives the sandbox's network flows; nil logs nothing.
	Recorder egress.Recorder
}

// localSandbox is a sandbox owned by this process alone (`fence run`).
type localSandbox struct {
	isolation.Sandbox
	backend *native.Backend
}

// Kill kills the sandbox and removes what its one-off backend made.
func (l *localSandbox) Kill(ctx context.Context) error {
	return errors.Join(l.Sandbox.Kill(ctx), l.backend.Close())
}

// NewLocal starts one sandbox in this process, without a daemon. Its
// cgroups and state live under an instance of their own (run-<pid>), so a
// daemon on the same data dir never mistakes it for its own leftovers.
func NewLocal(ctx context.Context, opts LocalOptions) (isolation.Sandbox, error) {
	if opts.TemplatesDir == "" {
		opts.TemplatesDir = filepath.Join(opts.DataDir, "templates")
	}
	templates, err := template.New(template.Options{Dir: opts.TemplatesDir})
	if err != nil {
		return nil, fmt.Errorf("opening templates: %w", err)
	}
	rootfs, err := templates.Resolve(opts.Template)
	if err != nil {
		return nil, err
	}
	b, err := native.New(ctx, native.Options{
		StateDir:  filepath.Join(opts.DataDir, "native"),
		Instance:  "run-" + strconv.Itoa(os.Getpid()),
		Ephemeral: true,
		Recorder:  opts.Recorder,
	})
	if err != nil {
		return nil, err
	}
	sb, err := b.Create(ctx, isolation.Spec{
		RootFS: rootfs,
		Limits: opts.Limits,
		Binds:  opts.Binds,
		Agent:  opts.Agent,
	})
	if err != nil {
		b.Close()
		return nil, err
	}
	return &localSandbox{Sandbox: sb, backend: b}, nil
}

// BuildTemplate builds template name, printing progress to progress.
func BuildTemplate(ctx context.Context, templatesDir, name string, force bool, progress io.Writer) error {
	st, err := template.New(template.Options{Dir: templatesDir, Progress: progress})
	if err != nil {
		return err
	}
	return st.BuildWithOptions(ctx, name, template.BuildOptions{Force: force})
}

// BenchOptions configures Bench.
type BenchOptions struct {
	DataDir, TemplatesDir, Template string
	Iterations                      int
	Peers                           bool
}

// Bench runs the benchmarks with a native backend of its own.
func Bench(ctx context.Context, opts BenchOptions, out io.Writer) error {
	if opts.TemplatesDir == "" {
		opts.TemplatesDir = filepath.Join(opts.DataDir, "templates")
	}
	templates, err := template.New(template.Options{Dir: opts.TemplatesDir})
	if err != nil {
		return err
	}
	rootfs, err := templates.Resolve(opts.Template)
	if err != nil {
		return err
	}
	b, err := native.New(ctx, native.Options{
		StateDir:  filepath.Join(opts.DataDir, "native"),
		Instance:  "bench-" + strconv.Itoa(os.Getpid()),
		DiskPool:  4,
		Ephemeral: true,
	})
	if err != nil {
		return err
	}
	defer func() {
		b.Cleanup(context.WithoutCancel(ctx))
		b.Close()
	}()
	return bench.Run(ctx, bench.Options{Backend: b, RootFS: rootfs, Iterations: opts.Iterations, Peers: opts.Peers}, out)
}
