// Command fence is the one fence binary: the daemon (`fence serve`), the
// CLI verbs, and the roles played inside sandboxes (internal/insandbox),
// which it also carries as the smaller in-sandbox binary
// (cmd/fence-sandbox) when built with scripts/build.sh. It only wires; the
// work is in internal/.
package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/fencesandbox/fence/internal/cli"
	"github.com/fencesandbox/fence/internal/daemon"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/insandbox"
	"github.com/fencesandbox/fence/internal/insandbox/embedded"
	"github.com/fencesandbox/fence/internal/insandbox/netclient"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/mcp"
	"github.com/fencesandbox/fence/internal/oci"
	"github.com/fencesandbox/fence/internal/router"
	"github.com/fencesandbox/fence/internal/selftest"
	"github.com/fencesandbox/fence/internal/template"
)

func main() {
	// The roles played inside a sandbox (init, agent, sudo, probe,
	// bench-client), and the native backend's spawner, start here, before
	// the CLI is built.
	if code, ok := insandbox.Main(os.Args); ok {
		os.Exit(code)
	}
	if len(os.Args) == 3 && os.Args[1] == embedded.Arg {
		os.Exit(embedded.Main(os.Args[2:]))
	}
	if len(os.Args) == 2 && os.Args[1] == native.HoldArg {
		native.Hold()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(cli.Run(ctx, deps(), os.Args[1:]))
}

func deps() cli.Deps {
	return cli.Deps{
		Serve: func(ctx context.Context, c daemon.Config) error {
			c.Logger, c.Stdout = logger(), os.Stdout
			return daemon.Serve(ctx, c)
		},
		Router: func(ctx context.Context, c router.Config) error {
			c.Logger, c.Stdout = logger(), os.Stdout
			c.MCP = mcp.ClusterHandler
			return router.Serve(ctx, c)
		},
		BuildTemplate: func(ctx context.Context, dataDir, templatesDir, name string, force bool, progress io.Writer) error {
			if templatesDir == "" {
				templatesDir = dataDir + "/templates"
			}
			return daemon.BuildTemplate(ctx, templatesDir, name, force, progress)
		},
		BuildImageTemplate: func(ctx context.Context, dataDir, templatesDir, name string, img cli.ImageSource, progress io.Writer) error {
			if templatesDir == "" {
				templatesDir = dataDir + "/templates"
			}
			src := template.ImageSource{Ref: img.Ref, Archive: img.Archive, Platform: img.Platform}
			switch {
			case img.Token != "":
				src.Auth = &oci.Auth{Token: img.Token}
			case img.Username != "":
				src.Auth = &oci.Auth{Username: img.Username, Password: img.Password}
			}
			return daemon.BuildImageTemplate(ctx, templatesDir, name, src, progress)
		},
		NewLocal: func(ctx context.Context, o cli.LocalOptions) (isolation.Sandbox, error) {
			return daemon.NewLocal(ctx, daemon.LocalOptions{
				DataDir:      o.DataDir,
				TemplatesDir: o.TemplatesDir,
				Template:     o.Template,
				Limits:       o.Limits,
				Binds:        o.Binds,
				Agent:        isolation.AgentConfig{EnvVars: o.Env, DefaultWorkdir: o.Workdir},
				Recorder:     flowRecorder(o.OnFlow),
				Backend:      o.Backend,
				Ask:          o.Ask,
				DNSUpstream:  o.DNSUpstream,
			})
		},
		Agent:       insandbox.RunAgent,
		SandboxInit: insandbox.RunInit,
		Bench: func(ctx context.Context, o cli.BenchOptions, out io.Writer) error {
			return daemon.Bench(ctx, daemon.BenchOptions{
				DataDir: o.DataDir, TemplatesDir: o.TemplatesDir, Template: o.Template,
				Iterations: o.Iterations, Peers: o.Peers, Density: o.Density, NetBytes: int64(o.NetMiB) << 20,
			}, out)
		},
		BenchClient: netclient.Main,
	}
}

// logger is the daemon's and the router's log: stderr, from level info.
func logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// flowRecorder hands a local sandbox's network decisions to f (for
// `fence selftest`); nil when f is.
func flowRecorder(f func(selftest.Flow)) egress.Recorder {
	if f == nil {
		return nil
	}
	return recorderFunc(func(_ context.Context, ev egress.FlowEvent) {
		f(selftest.Flow{Proto: ev.Proto, Dst: ev.Dst, Name: ev.Name, Allowed: ev.Allowed, Reason: ev.Reason})
	})
}

type recorderFunc func(context.Context, egress.FlowEvent)

func (r recorderFunc) Record(ctx context.Context, ev egress.FlowEvent) { r(ctx, ev) }
