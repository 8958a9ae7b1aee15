package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"github.com/fencesandbox/fence/internal/bench"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/gvisor"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/netfence"
	"github.com/fencesandbox/fence/internal/sandbox"
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
	// Backend is "native" (empty) or "gvisor".
	Backend string
	// Ask, if set, is network approval "ask": a lookup of a name the
	// sandbox may not reach waits for Ask, and proceeds (the name
	// reachable for egress.OnceGrant) if it returns true. It must return
	// when ctx ends.
	Ask func(ctx context.Context, name string) bool
	// DNSUpstream answers the sandbox's allowed lookups (ip:port); "" is
	// the host's resolver.
	DNSUpstream string
}

// localBackend is a one-off backend of `fence run`.
type localBackend interface {
	isolation.Backend
	Close() error
}

// localSandbox is a sandbox owned by this process alone (`fence run`).
type localSandbox struct {
	isolation.Sandbox
	backend localBackend
}

// Kill kills the sandbox and removes what its one-off backend made.
func (l *localSandbox) Kill(ctx context.Context) error {
	return errors.Join(l.Sandbox.Kill(ctx), l.backend.Close())
}

// Unwrap returns the backend's sandbox, whose capabilities are found
// through this one with isolation.As.
func (l *localSandbox) Unwrap() isolation.Sandbox { return l.Sandbox }

// localNetwork is the fence of a one-off sandbox (`fence run`): deny-all,
// its flows recorded by rec (nil: logged at debug level), a lookup of a
// name held for ask when it is set, and answered by dnsUpstream ("": the
// host's resolver).
func localNetwork(rec egress.Recorder, ask func(ctx context.Context, name string) bool, dnsUpstream string) isolation.Network {
	f := netfence.Fence{Recorder: rec, DNSUpstream: dnsUpstream}
	if ask != nil {
		f.Ask = func(string) func(context.Context, string) egress.Approval {
			return func(ctx context.Context, name string) egress.Approval {
				if ask(ctx, name) {
					return egress.AllowOnce
				}
				return egress.Refused
			}
		}
	}
	f = f.WithDefaults()
	return f.New(nil)
}

// NewLocal starts one sandbox in this process, without a daemon. Its
// cgroups and state live under an instance of their own (run-<pid>), so a
// daemon on the same data dir never mistakes it for its own leftovers.
func NewLocal(ctx context.Context, opts LocalOptions) (isolation.Sandbox, error) {
	var err error
	if opts.DataDir, opts.TemplatesDir, err = resolveDirs(opts.DataDir, opts.TemplatesDir); err != nil {
		return nil, err
	}
	templates, err := template.New(template.Options{Dir: opts.TemplatesDir})
	if err != nil {
		return nil, fmt.Errorf("opening templates: %w", err)
	}
	rootfs, err := templates.Resolve(opts.Template)
	if err != nil {
		return nil, err
	}
	var b localBackend
	switch opts.Backend {
	case "", BackendNative:
		b, err = native.New(ctx, native.Options{
			StateDir:  filepath.Join(opts.DataDir, "native"),
			FenceDirs: []string{opts.DataDir, opts.TemplatesDir},
			Instance:  "run-" + strconv.Itoa(os.Getpid()),
			Ephemeral: true,
			Network:   localNetwork(opts.Recorder, opts.Ask, opts.DNSUpstream),
		})
	case BackendGvisor:
		b, err = gvisor.New(ctx, gvisor.Options{
			StateDir:  filepath.Join(opts.DataDir, "gvisor"),
			Instance:  "run-" + strconv.Itoa(os.Getpid()),
			Ephemeral: true,
			Network:   localNetwork(opts.Recorder, opts.Ask, opts.DNSUpstream),
		})
	default:
		return nil, fmt.Errorf("unknown backend %q (native or gvisor)", opts.Backend)
	}
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

// BuildImageTemplate builds template name from a container image,
// printing progress to progress.
func BuildImageTemplate(ctx context.Context, templatesDir, name string, src template.ImageSource, progress io.Writer) error {
	st, err := template.New(template.Options{Dir: templatesDir, Progress: progress})
	if err != nil {
		return err
	}
	_, err = st.BuildImage(ctx, name, src)
	return err
}

// BenchOptions configures Bench.
type BenchOptions struct {
	DataDir, TemplatesDir, Template string
	Iterations                      int
	Peers                           bool
	// Density, when above zero, adds the density run: that many idle
	// sandboxes through the API.
	Density int
	// NetBytes, when above zero, adds the network measure.
	NetBytes int64
}

// Bench runs the benchmarks with a native backend of its own.
func Bench(ctx context.Context, opts BenchOptions, out io.Writer) error {
	var err error
	if opts.DataDir, opts.TemplatesDir, err = resolveDirs(opts.DataDir, opts.TemplatesDir); err != nil {
		return err
	}
	templates, err := template.New(template.Options{Dir: opts.TemplatesDir})
	if err != nil {
		return err
	}
	rootfs, err := templates.Resolve(opts.Template)
	if err != nil {
		return err
	}
	// The sandboxes of the measures resolve through the benchmark's own
	// DNS server (the network measure times lookups of its name).
	dnsAddr, stopDNS, err := bench.StartDNS()
	if err != nil {
		return err
	}
	defer stopDNS()
	fence := netfence.Fence{DNSUpstream: dnsAddr}.WithDefaults()
	b, err := native.New(ctx, native.Options{
		StateDir:   filepath.Join(opts.DataDir, "native"),
		Instance:   "bench-" + strconv.Itoa(os.Getpid()),
		DiskPool:   4,
		ReadyInits: readyInits, // as the daemon's
		Ephemeral:  true,
		Network:    fence.New(nil),
	})
	if err != nil {
		return err
	}
	defer func() {
		b.Cleanup(context.WithoutCancel(ctx))
		b.Close()
	}()
	if opts.Density > 0 && opts.MaxSandboxes() < opts.Density {
		return fmt.Errorf("--density %d: at most %d", opts.Density, opts.MaxSandboxes())
	}
	tmpls := []string{opts.Template}
	if _, err := templates.Resolve("base"); err == nil && opts.Template != "base" {
		tmpls = append(tmpls, "base")
	}
	return bench.Run(ctx, bench.Options{
		Backend: b, Fence: &fence, RootFS: rootfs, Iterations: opts.Iterations, Peers: opts.Peers,
		Daemon: benchDaemon(opts), Templates: tmpls, Density: opts.Density, NetBytes: opts.NetBytes,
		DNSServer: dnsAddr,
	}, out)
}

// benchDaemonLog is the file, in the benchmark's data dir, its daemons log to.
const benchDaemonLog = "bench-daemon.log"

// MaxSandboxes is the most sandboxes a benchmark daemon holds.
func (BenchOptions) MaxSandboxes() int { return 5000 }

// benchDaemon starts daemons in this process for the API measures of
// `fence bench`, on a data dir of their own below opts.DataDir (so that a
// crashed run's leftovers are removed by the next one's start) and a
// loopback port. Each logs, as `fence serve` does, to the run's daemon log
// (benchDaemonLog below opts.DataDir, begun anew by the run's first start),
// which a failed measure quotes.
func benchDaemon(opts BenchOptions) bench.DaemonStarter {
	var started atomic.Bool
	return func(ctx context.Context, warmPool int, warmTemplates ...string) (*bench.Daemon, error) {
		raw := make([]byte, 20)
		if _, err := rand.Read(raw); err != nil {
			return nil, err
		}
		key := "e2b_" + hex.EncodeToString(raw)
		logPath := filepath.Join(opts.DataDir, benchDaemonLog)
		flags := os.O_WRONLY | os.O_CREATE | os.O_APPEND
		if !started.Swap(true) {
			flags |= os.O_TRUNC
		}
		logFile, err := os.OpenFile(logPath, flags, 0o600)
		if err != nil {
			return nil, fmt.Errorf("the benchmark daemon's log: %w", err)
		}
		log := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo}))
		log.Info("benchmark daemon starting", "warm_pool", warmPool, "warm_templates", warmTemplates)
		ctx, cancel := context.WithCancel(ctx)
		ready := make(chan net.Addr, 1)
		done := make(chan error, 1)
		go func() {
			err := Serve(ctx, Config{
				Addr:          "127.0.0.1:0",
				DataDir:       filepath.Join(opts.DataDir, "bench-api"),
				TemplatesDir:  opts.TemplatesDir,
				APIKey:        key,
				Defaults:      sandbox.Defaults{},
				WarmPool:      warmPool,
				WarmTemplates: warmTemplateOpts(warmTemplates, warmPool),
				MaxSandboxes:  opts.MaxSandboxes(),
				Logger:        log,
				Stdout:        logFile,
				Ready:         func(a net.Addr) { ready <- a },
			})
			log.Info("benchmark daemon stopped", "err", err)
			logFile.Close()
			done <- err
		}()
		select {
		case a := <-ready:
			d := &bench.Daemon{URL: "http://" + a.String(), APIKey: key, Log: logPath, Stop: func() error {
				cancel()
				return <-done
			}}
			if warmPool > 0 {
				d.Pooled = []string{"minimal"}
				if _, err := os.Stat(filepath.Join(opts.TemplatesDir, "base")); err == nil {
					d.Pooled = []string{"base"}
				}
				d.Pooled = append(d.Pooled, warmTemplates...)
			}
			return d, nil
		case err := <-done:
			cancel()
			return nil, fmt.Errorf("starting the benchmark daemon (its log: %s): %w", logPath, err)
		}
	}
}

// warmTemplateOpts keeps size sandboxes of each of names ahead.
func warmTemplateOpts(names []string, size int) []WarmTemplate {
	var wt []WarmTemplate
	for _, n := range names {
		wt = append(wt, WarmTemplate{Name: n, Size: size})
	}
	return wt
}
