package cli

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	fencedaemon "github.com/fencesandbox/fence/internal/daemon"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/tbuild"
)

// addLimitFlags binds the resource-limit flags shared by serve and run to
// the fields of l.
func addLimitFlags(fs *pflag.FlagSet, l *sandbox.Defaults) {
	d := defaultLimits()
	fs.Float64Var(&l.CPUs, "cpus", d.CPUs, "CPU bandwidth per sandbox, in cores; keep it below the host's core count, so that one busy sandbox cannot take every core from the others and the daemon")
	fs.Int64Var(&l.MemoryMB, "memory-mb", d.MemoryBytes>>20, "memory limit per sandbox in MiB, swap included")
	fs.Int64Var(&l.Pids, "pids", d.Pids, "maximum number of processes and threads per sandbox")
	fs.Int64Var(&l.DiskMB, "disk-mb", d.DiskBytes>>20, "writable disk per sandbox in MiB")
	fs.Uint64Var(&l.NoFile, "nofile", d.NoFile, "open-file limit (RLIMIT_NOFILE) per sandbox")
}

// checkLimits refuses limits that are not all above zero.
func checkLimits(l sandbox.Defaults) error {
	if l.CPUs <= 0 || l.MemoryMB <= 0 || l.Pids <= 0 || l.DiskMB <= 0 || l.NoFile == 0 {
		return usagef("--cpus, --memory-mb, --pids, --disk-mb and --nofile must be above zero")
	}
	return nil
}

// templatesDir returns dir, or dataDir/templates when dir is empty.
func templatesDir(dir, dataDir string) string {
	if dir != "" {
		return dir
	}
	return filepath.Join(dataDir, "templates")
}

const serveLong = `Run the fence daemon: the E2B-compatible control plane and the proxy for
sandbox traffic, on one listener.

Clients authenticate with an API key: $FENCE_API_KEY if set, else the key in
DATA-DIR/api-key, generated on first start. Point the E2B SDKs at the daemon:
  E2B_API_URL=http://ADDR E2B_SANDBOX_URL=http://ADDR E2B_API_KEY=<key>

Every sandbox's network goes through a user-space TCP/IP stack in the
daemon: egress is denied unless the create request says something about it
(allow_internet_access, network.denyOut and its allowOut exceptions: names,
*.wildcards and CIDRs, as on E2B; see docs/NETWORK.md), and the host, link-local, metadata and private addresses are never
reachable, nor are the ranges given with --deny-cidr. DNS answers come from
the daemon and only for allowed names.

The limits below are the defaults of every sandbox. The daemon stops on
SIGINT or SIGTERM.`

func serveCmd(deps Deps) *cobra.Command {
	var c fencedaemon.Config
	var cl clusterFlags
	var warmCI int
	var rg registryFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the fence daemon (E2B-compatible API)",
		Long:  serveLong,
		Example: `  # Serve on the default address with the default data directory
  sudo fence serve

  # Listen on all interfaces, allow 200 sandboxes of 1 GiB each
  sudo fence serve --addr 0.0.0.0:3000 --memory-mb 1024 --max-sandboxes 200`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if deps.Serve == nil {
				return errUnavailable("fence serve")
			}
			c.Database = cmp.Or(c.Database, os.Getenv("FENCE_DATABASE_URL"))
			if err := checkServe(c); err != nil {
				return err
			}
			var err error
			if c.Cluster, err = cl.options(); err != nil {
				return err
			}
			if c.Registry, err = rg.options(c.Database); err != nil {
				return err
			}
			if c.DrainMoves && c.Registry == nil {
				return usagef("--drain-moves needs --database and --registry: a moved sandbox is recorded in the one and its files kept in the other")
			}
			c.TemplatesDir = templatesDir(c.TemplatesDir, c.DataDir)
			if c.WarmTemplates, err = withCodeInterpreterPool(c.WarmTemplates, warmCI); err != nil {
				return err
			}
			c.APIKey = os.Getenv("FENCE_API_KEY")
			return untilSignal(cmd, "serving", func(ctx context.Context) error { return deps.Serve(ctx, c) })
		},
	}
	fs := cmd.Flags()
	addServeFlags(fs, &c)
	addWarmCodeInterpreterFlag(fs, &warmCI)
	cl.add(fs)
	rg.add(fs)
	for _, f := range []string{"http-header-timeout", "http-idle-timeout", "http-body-idle-timeout", "audit"} {
		_ = fs.MarkHidden(f)
	}
	return cmd
}

// untilSignal runs f with the command's context, done on SIGINT or
// SIGTERM; f's error is wrapped as "what: …".
func untilSignal(cmd *cobra.Command, what string, f func(ctx context.Context) error) error {
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := f(ctx); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// lifetimeValue is --max-lifetime: a duration, 0 for no cap (stored as
// a negative one, daemon.Config's "no cap").
type lifetimeValue struct{ p *time.Duration }

func (v *lifetimeValue) String() string {
	if v.p == nil || *v.p < 0 {
		return "0s"
	}
	return v.p.String()
}

func (v *lifetimeValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("want a duration such as 24h or 720h, or 0 for no cap")
	}
	if d == 0 {
		d = -1
	}
	*v.p = d
	return nil
}

func (v *lifetimeValue) Type() string { return "duration" }

// addServeFlags binds `fence serve`'s flags (but the cluster's) to the
// fields of c.
func addServeFlags(fs *pflag.FlagSet, c *fencedaemon.Config) {
	fs.StringVar(&c.Addr, "addr", DefaultAddr, "listen address (host:port) for the API and sandbox traffic")
	fs.StringVar(&c.DataDir, "data-dir", DefaultDataDir, "directory for the daemon's state")
	fs.StringVar(&c.TemplatesDir, "templates-dir", "", "directory of built templates (default DATA-DIR/templates)")
	fs.StringVar(&c.Domain, "domain", DefaultDomain, "base domain of sandbox hosts ({port}-{id}.DOMAIN)")
	addLimitFlags(fs, &c.Defaults)
	fs.DurationVar(&c.Defaults.Timeout, "timeout", DefaultTimeout, "default time to live of a sandbox")
	fs.IntVar(&c.MaxSandboxes, "max-sandboxes", DefaultMaxSandboxes, "maximum number of sandboxes alive at once")
	fs.DurationVar(&c.Defaults.IdleTimeout, "idle-pause", 0, "pause a sandbox (keeping its memory) once it has had no traffic, no SSH session and no CPU use for this long, unless its create sets lifecycle.idleTimeout; the next traffic resumes it (0: off)")
	c.MaxLifetime = DefaultMaxLifetime
	fs.Var(&lifetimeValue{p: &c.MaxLifetime}, "max-lifetime", "longest timeout a sandbox may be given at create, connect or timeout (0: no cap; the teams' maximum lifetimes still apply)")
	addTeamLimitFlags(fs, &c.TeamLimits)
	fs.BoolVar(&c.TuneKernel, "tune-kernel", false, "raise kernel.pid_max to 4194304 (as systemd does) and the inotify limits the watch API needs, where they are lower")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "serve HTTPS with this certificate (PEM; a wildcard for *.DOMAIN suits the SDKs)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "private key (PEM) of --tls-cert")
	fs.BoolVar(&c.NoUI, "no-ui", false, "do not serve the web dashboard at /ui")
	fs.DurationVar(&c.UISessionTTL, "ui-session-ttl", 0, "life of a web dashboard session (default 12h)")
	fs.StringVar(&c.SSHAddr, "ssh-addr", "", "serve SSH into sandboxes on this address (e.g. :2222; `ssh ID@host -p 2222`); empty: no SSH server")
	fs.StringVar(&c.DNSUpstream, "dns-upstream", "", "resolver (ip:port) that answers the sandboxes' allowed DNS queries (default: the host's first nameserver)")
	fs.StringVar(&c.LayerFS, "layer-fs", "", "native layer store: btrfs (writable layers as subvolumes, checkpoints as snapshots, in a btrfs image under the data dir; needs mkfs.btrfs) or copy (default: btrfs if the data dir is on btrfs, else copy)")
	fs.Var(newSizeValue(&c.LayerFSSize, "32G", "want a size of at least 1G", atLeast(1<<30)), "layer-fs-size", "size of the sparse btrfs image of --layer-fs btrfs")
	fs.Var(&mbpsValue{p: &c.NetBandwidth}, "net-mbps", "network bandwidth per sandbox and direction, in Mbit/s (0: no limit)")
	fs.BoolVar(&c.AllowInternet, "allow-internet", false, "let sandboxes that ask nothing about their network reach public addresses (default: deny all egress)")
	fs.BoolVar(&c.Inspect, "inspect", false, "let the egress gateway decrypt every name-allowed HTTPS flow and check each request's Host (closes domain fronting; pinned clients need network.passthrough)")
	fs.DurationVar(&c.ApprovalTimeout, "approval-timeout", 0, "how long a lookup of a sandbox with network approval \"ask\" waits for a decision (GET /approvals) before it is refused (default 1m)")
	fs.StringVar(&c.UpstreamCA, "upstream-ca", "", "PEM bundle of roots the egress gateway trusts for upstream servers, instead of the host's")
	fs.Var(&listValue[netip.Prefix]{p: &c.DenyCIDRs, parse: parseDenyCIDR}, "deny-cidr", "a range (CIDR or address) no sandbox may ever reach, whatever its policy allows; repeatable")
	fs.StringVar(&c.Backend, "backend", "", "default isolation backend: native (the default) or gvisor; a create picks the other with metadata fence.backend")
	fs.IntVar(&c.WarmPool, "warm-pool", DefaultWarmPool, "sandboxes of the default template (base, else minimal) kept started ahead of requests; 0 disables")
	fs.Var(&listValue[fencedaemon.WarmTemplate]{p: &c.WarmTemplates, parse: parseWarmTemplate}, "warm-template", "also keep N sandboxes of template NAME started ahead of requests, its start command run and its ready command passed (NAME=N; repeatable; the template must exist when the daemon starts)")
	fs.StringArrayVar(&c.BuildAllow, "build-allow", nil, "also let template build steps reach this allowOut entry (HOST[:PORTS], CIDR[:PORTS], *.DOMAIN, @preset), besides the package registries; repeatable")
	fs.StringVar(&c.PipIndexURL, "pip-index-url", "", "package index (PEP 503) template build steps' pip uses, e.g. an internal mirror; its host is added to the build allowlist")
	fs.DurationVar(&c.HTTP.Header, "http-header-timeout", 0, "time a client has to send a request's headers (default 10s)")
	fs.DurationVar(&c.HTTP.Idle, "http-idle-timeout", 0, "time a keep-alive connection may wait for its next request (default 2m)")
	fs.DurationVar(&c.HTTP.BodyIdle, "http-body-idle-timeout", 0, "time a client may send nothing of a request body (default 1m)")
	fs.StringArrayVar(&c.AuditForward, "audit-forward", nil, "also send every audit record to file:PATH, syslog:HOST:PORT, syslog+tcp:HOST:PORT or https://URL; repeatable")
	fs.DurationVar(&c.AuditRetention, "audit-retention", 0, "how long audit records and kept command output stay (default 168h; negative: forever)")
	fs.Var(newSizeValue(&c.AuditMaxBytes, "", "want a size of at least 1MiB such as 500MiB or 8GiB, or 0 for no cap", auditCap), "audit-max-bytes", "disk the audit records may take, oldest segments pruned first (each removal recorded and signed), e.g. 2GiB (default 8GiB; 0: no cap)")
	fs.DurationVar(&c.ForensicsRetention, "forensics-retention", 0, "how long a killed sandbox's filesystem changes are kept for `fence sandbox export` (default 24h; negative: not kept)")
	fs.Var(newSizeValue(&c.ForensicsBudget, "", "want a size above zero such as 500MiB or 2GiB", atLeast(1)), "forensics-budget", "disk the kept filesystem changes may take in all, oldest dropped first, e.g. 500MiB (default 2GiB)")
	boolVarNot(fs, &c.NoAudit, "audit", "keep the audit trail (off only to measure its cost)")
	fs.StringVar(&c.Database, "database", "", "PostgreSQL URL (postgres://USER:PASSWORD@HOST/DB) of the records a cluster's nodes share: teams, keys, limits, quotas, secrets (default $FENCE_DATABASE_URL, else DATA-DIR/fence.db alone); see docs/CLUSTER.md")
	fs.BoolVar(&c.DrainMoves, "drain-moves", false, "on a cluster node with --database and --registry: when the node is drained (fence.dev/drain=true on its Lease), pause its sandboxes into the registry; their next connect or resume takes them over on another node")
	fs.StringVar(&c.SecretsKey, "secrets-key", "", "file of the key sealing secrets (default DATA-DIR/secrets.key, made on first use); with --database it must exist, the same on every node")
}

// atLeast accepts the sizes of min bytes or more.
func atLeast(min int64) func(int64) (int64, bool) {
	return func(n int64) (int64, bool) { return n, n >= min }
}

// auditCap accepts 0 (no cap, -1 in the configuration) and sizes of
// 1 MiB or more.
func auditCap(n int64) (int64, bool) {
	if n == 0 {
		return -1, true
	}
	return n, n >= 1<<20
}

// checkServe refuses what the flags parsed into c but the daemon cannot
// serve with; the cluster's flags are checked apart (clusterFlags).
func checkServe(c fencedaemon.Config) error {
	if err := checkLimits(c.Defaults); err != nil {
		return err
	}
	if err := checkTeamLimits(c.TeamLimits); err != nil {
		return err
	}
	if c.Database != "" && !strings.HasPrefix(c.Database, "postgres://") && !strings.HasPrefix(c.Database, "postgresql://") {
		return usagef("--database must be a postgres:// URL")
	}
	if c.Database != "" && c.SecretsKey == "" {
		return usagef("--database needs --secrets-key: every node seals and opens secrets with the one key given to it")
	}
	switch {
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return usagef("--tls-cert and --tls-key go together")
	case c.LayerFS != "" && c.LayerFS != "copy" && c.LayerFS != "btrfs":
		return usagef("--layer-fs must be copy or btrfs")
	case c.Backend != "" && c.Backend != "native" && c.Backend != "gvisor":
		return usagef("--backend must be native or gvisor, got %q", c.Backend)
	case c.WarmPool < 0 || c.WarmPool > 64:
		return usagef("--warm-pool must be between 0 and 64")
	}
	if err := tbuild.CheckAllow(c.BuildAllow); err != nil {
		return usagef("--build-allow: %v", err)
	}
	if c.PipIndexURL != "" {
		if _, err := tbuild.ParsePipIndex(c.PipIndexURL); err != nil {
			return usagef("--pip-index-url: %v", err)
		}
	}
	switch {
	case c.HTTP.Header < 0 || c.HTTP.Idle < 0 || c.HTTP.BodyIdle < 0:
		return usagef("--http-*-timeout must not be negative")
	case c.Defaults.Timeout <= 0 || c.MaxSandboxes <= 0:
		return usagef("--timeout and --max-sandboxes must be above zero")
	case c.MaxLifetime > 0 && c.Defaults.Timeout > c.MaxLifetime:
		return usagef("--timeout %v is longer than --max-lifetime %v", c.Defaults.Timeout, c.MaxLifetime)
	case c.Defaults.IdleTimeout != 0 && (c.Defaults.IdleTimeout < time.Second || c.Defaults.IdleTimeout > 30*24*time.Hour):
		return usagef("--idle-pause must be 0 (off) or between 1s and 720h")
	}
	return nil
}

func templateCmd(deps Deps) *cobra.Command {
	group := groupCmd("template", "Build the templates sandboxes start from")
	var dataDir, tdir string
	var force bool
	var img ImageSource
	var archiveRef string
	var df dockerfileFlags
	build := &cobra.Command{
		Use:   "build NAME",
		Short: "Build a template",
		Long:  templateBuildLong,
		Example: `  fence template build minimal
  fence template build base --force
  fence template build py --from-image python:3.12-slim
  docker save myimage:1 -o img.tar && fence template build my --from-archive img.tar
  fence template build myapp -f Dockerfile --context .`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if df.file != "" {
				if img.Ref != "" || img.Archive != "" {
					return usagef("-f and --from-image/--from-archive exclude each other")
				}
				return buildDockerfile(cmd.Context(), &df, dataDir, name, cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			if img.Ref != "" || img.Archive != "" {
				if img.Ref != "" && img.Archive != "" {
					return usagef("--from-image and --from-archive exclude each other (select an image of an archive with --archive-ref)")
				}
				if img.Archive != "" {
					img.Ref = archiveRef
				}
				return buildImageTemplate(cmd, deps, dataDir, templatesDir(tdir, dataDir), name, img)
			}
			if deps.BuildTemplate == nil {
				return errUnavailable("fence template build")
			}
			if name != "minimal" && name != "base" && name != "code-interpreter" && name != "mcp-gateway" && name != "desktop" {
				return usagef("unknown template %q: want minimal, base, code-interpreter, mcp-gateway or desktop, or an image with --from-image or --from-archive", name)
			}
			if err := deps.BuildTemplate(cmd.Context(), dataDir, templatesDir(tdir, dataDir), name, force, cmd.ErrOrStderr()); err != nil {
				return fmt.Errorf("building template %s: %w", name, err)
			}
			return nil
		},
	}
	fs := build.Flags()
	fs.StringVar(&dataDir, "data-dir", DefaultDataDir, "directory for fence's state")
	fs.StringVar(&tdir, "templates-dir", "", "directory of built templates (default DATA-DIR/templates)")
	fs.BoolVar(&force, "force", false, "rebuild the template if it exists")
	fs.StringVar(&img.Ref, "from-image", "", "build from this registry image (docker.io/library/debian:bookworm, REPO@sha256:...)")
	fs.StringVar(&img.Archive, "from-archive", "", "build from an OCI layout directory or a docker save tarball")
	fs.StringVar(&archiveRef, "archive-ref", "", "with --from-archive: the image to take when the archive holds several")
	fs.StringVar(&img.Platform, "platform", "", "image platform os/arch[/variant] (default linux/<host arch>)")
	df.add(fs)
	group.AddCommand(build, templateListCmd(), templateRmCmd(), templateTagsCmd())
	return group
}

// buildImageTemplate builds template name from img (`fence template build
// --from-image|--from-archive`), with the registry credentials of the
// environment.
func buildImageTemplate(cmd *cobra.Command, deps Deps, dataDir, tdir, name string, img ImageSource) error {
	if deps.BuildImageTemplate == nil {
		return errUnavailable("fence template build --from-image")
	}
	img.Username = os.Getenv("FENCE_REGISTRY_USERNAME")
	img.Password = os.Getenv("FENCE_REGISTRY_PASSWORD")
	img.Token = os.Getenv("FENCE_REGISTRY_TOKEN")
	if err := deps.BuildImageTemplate(cmd.Context(), dataDir, tdir, name, img, cmd.ErrOrStderr()); err != nil {
		return fmt.Errorf("building template %s: %w", name, err)
	}
	return nil
}

const templateBuildLong = `Build a template, an immutable directory tree that sandboxes share
read-only:
  minimal  busybox; builds in seconds, for tests
  base     Debian bookworm with python (3) and pip, node and npm, curl, git,
           sudo and user "user"
  code-interpreter  base plus Jupyter's Python kernel, numpy, pandas and
           matplotlib, and the @e2b/code-interpreter server on port 49999
           (also answers to code-interpreter-v1)
  mcp-gateway  base plus the mcp-gateway command of E2B's mcp option
           (Sandbox.create({mcp: ...})); build base first
  desktop  base plus an X desktop (Xvfb, XFCE, xdotool, scrot, x11vnc,
           noVNC), chromium and xterm, for the @e2b/desktop SDK
           (docs/DESKTOP.md)
A built-in template is kept unless --force or its definition changed.

With --from-image REF (a registry reference) or --from-archive PATH (an OCI
layout directory or a docker save tarball), NAME is any template name and
the template is unpacked from that image, replacing one of the same name.
Layers are cached and shared between templates. Registry credentials come
from FENCE_REGISTRY_USERNAME and FENCE_REGISTRY_PASSWORD, or
FENCE_REGISTRY_TOKEN. Progress goes to stderr.

With -f, NAME is built from a Dockerfile by the running daemon (E2B's
template build API): every RUN runs in a sandbox, egress limited to the
package registries, layers cached; see docs/TEMPLATES.md.`

func benchCmd(deps Deps) *cobra.Command {
	var o BenchOptions
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure sandbox create/exec/kill latency, against peers",
		Long: `Measure fence on this machine, with the peers side by side in the same run:

  - create → exec true → kill, cold (no sandbox of the template ready; the
    backend keeps two sandbox inits started ahead, as the daemon does), and
    its phases (create, exec, kill) and, on the native backend, a create's
    steps, the daemon's and the sandbox init's, on one clock;
  - the same from the warm pool, and exec in a running sandbox;
  - pause and resume of a sandbox holding 100 MiB;
  - the SDK-shaped round trip through the API of a daemon started for the
    run (create → run 'echo hi' → kill, per phase), for --template and base;
    a template the daemon's warm pool does not serve is measured cold, then
    again on a daemon that keeps two of it ahead (--warm-template NAME=2);
  - with --peers, bwrap, runc and a plain fork+exec running the same /bin/true
    in the same root filesystem; ratios are given to bwrap;
  - the network on the real path: a sandbox's download from a server in a
    network namespace of its own (198.18.0.2, joined by a veth), and the
    same client on the host; throughput, CPU per MiB on each path (which
    divides a machine without idle CPU) and new-connection time;
  - with --density N, N idle sandboxes created through the API by 8 clients:
    create rate at the start and at the end, the daemon's memory per idle
    sandbox, the machine's CPU time with them idle and the commands that
    take most of it, the kernel's pivot_root (which every runtime's start
    pays, and which walks every thread on the host) with none and with
    them alive, and whether every sandbox still answers.

Absolute times differ between machines (up to 3x on machines of one kind);
compare the ratios. The daemon's state for the API measures lives in
DATA-DIR/bench-api.`,
		Example: `  sudo fence bench --iterations 50
  sudo fence bench --peers
  sudo fence bench --iterations 5 --density 2000`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if deps.Bench == nil {
				return errUnavailable("fence bench")
			}
			if o.Iterations <= 0 {
				return usagef("--iterations must be above zero")
			}
			if o.Density < 0 {
				return usagef("--density must not be negative")
			}
			if o.NetMiB < 0 {
				return usagef("--net-mib must not be negative")
			}
			o.TemplatesDir = templatesDir(o.TemplatesDir, o.DataDir)
			return deps.Bench(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&o.Iterations, "iterations", 100, "number of create/exec/kill cycles")
	fs.StringVar(&o.Template, "template", "minimal", "template the sandboxes start from")
	fs.StringVar(&o.DataDir, "data-dir", DefaultDataDir, "directory for fence's state")
	fs.StringVar(&o.TemplatesDir, "templates-dir", "", "directory of built templates (default DATA-DIR/templates)")
	fs.BoolVar(&o.Peers, "peers", false, "also run the peer runtimes found on this machine")
	fs.IntVar(&o.Density, "density", 0, "also create this many idle sandboxes through the API (0: skip)")
	fs.IntVar(&o.NetMiB, "net-mib", 256, "size of the network measure's download in MiB (0: skip)")
	return cmd
}

func benchClientCmd(deps Deps) *cobra.Command {
	return &cobra.Command{
		Use:                "bench-client",
		Short:              "The network measure's client (internal, run by fence bench)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if deps.BenchClient == nil {
				return errUnavailable("fence bench-client")
			}
			return deps.BenchClient(args, cmd.OutOrStdout())
		},
	}
}

func agentCmd(deps Deps) *cobra.Command {
	return &cobra.Command{
		Use:                "agent",
		Short:              "Run the in-sandbox agent (internal)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if deps.Agent == nil {
				return errUnavailable("fence agent")
			}
			return deps.Agent(cmd.Context())
		},
	}
}

func initCmd(deps Deps) *cobra.Command {
	return &cobra.Command{
		Use:                "init",
		Short:              "Set up a new sandbox (internal, started by the native backend)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if deps.SandboxInit == nil {
				return errUnavailable("fence init")
			}
			return deps.SandboxInit()
		},
	}
}
