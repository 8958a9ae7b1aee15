package cli

import (
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/tbuild"
)

// limitFlags are the resource-limit flags shared by serve and run.
type limitFlags struct {
	cpus     float64
	memoryMB int64
	pids     int64
	diskMB   int64
	nofile   uint64
}

func (l *limitFlags) add(fs *pflag.FlagSet) {
	d := defaultLimits()
	fs.Float64Var(&l.cpus, "cpus", d.CPUs, "CPU bandwidth per sandbox, in cores; keep it below the host's core count, so that one busy sandbox cannot take every core from the others and the daemon")
	fs.Int64Var(&l.memoryMB, "memory-mb", d.MemoryBytes>>20, "memory limit per sandbox in MiB, swap included")
	fs.Int64Var(&l.pids, "pids", d.Pids, "maximum number of processes and threads per sandbox")
	fs.Int64Var(&l.diskMB, "disk-mb", d.DiskBytes>>20, "writable disk per sandbox in MiB")
	fs.Uint64Var(&l.nofile, "nofile", d.NoFile, "open-file limit (RLIMIT_NOFILE) per sandbox")
}

func (l *limitFlags) limits() (isolation.Limits, error) {
	if l.cpus <= 0 || l.memoryMB <= 0 || l.pids <= 0 || l.diskMB <= 0 || l.nofile == 0 {
		return isolation.Limits{}, usagef("--cpus, --memory-mb, --pids, --disk-mb and --nofile must be above zero")
	}
	return isolation.Limits{
		CPUs:        l.cpus,
		MemoryBytes: l.memoryMB << 20,
		Pids:        l.pids,
		DiskBytes:   l.diskMB << 20,
		NoFile:      l.nofile,
	}, nil
}

// templatesDir returns dir, or dataDir/templates when dir is empty.
func templatesDir(dir, dataDir string) string {
	if dir != "" {
		return dir
	}
	return filepath.Join(dataDir, "templates")
}

func serveCmd(deps Deps) *cobra.Command {
	var o ServeOptions
	var lim limitFlags
	var denyCIDRs []string
	var warmTemplates []string
	var layerFSSize string
	var forensicsBudget, auditMaxBytes string
	var netMbps int64
	var cl clusterFlags
	auditOn := true
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the fence daemon (E2B-compatible API)",
		Long: `Run the fence daemon: the E2B-compatible control plane and the proxy for
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
SIGINT or SIGTERM.`,
		Example: `  # Serve on the default address with the default data directory
  sudo fence serve

  # Listen on all interfaces, allow 200 sandboxes of 1 GiB each
  sudo fence serve --addr 0.0.0.0:3000 --memory-mb 1024 --max-sandboxes 200`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if deps.Serve == nil {
				return errUnavailable("fence serve")
			}
			limits, err := lim.limits()
			if err != nil {
				return err
			}
			if (o.TLSCert == "") != (o.TLSKey == "") {
				return usagef("--tls-cert and --tls-key go together")
			}
			if o.LayerFS != "" && o.LayerFS != "copy" && o.LayerFS != "btrfs" {
				return usagef("--layer-fs must be copy or btrfs")
			}
			if o.LayerFSSize, err = parseBytes(layerFSSize); err != nil || o.LayerFSSize < 1<<30 {
				return usagef("--layer-fs-size: want a size of at least 1G")
			}
			if netMbps < 0 {
				return usagef("--net-mbps must not be negative")
			}
			o.NetBandwidth = netMbps * 1_000_000 / 8
			if o.DenyCIDRs, err = parseDenyCIDRs(denyCIDRs); err != nil {
				return err
			}
			if o.Backend != "" && o.Backend != "native" && o.Backend != "gvisor" {
				return usagef("--backend must be native or gvisor, got %q", o.Backend)
			}
			if o.WarmPool < 0 || o.WarmPool > 64 {
				return usagef("--warm-pool must be between 0 and 64")
			}
			if o.WarmTemplates, err = parseWarmTemplates(warmTemplates); err != nil {
				return err
			}
			if err := tbuild.CheckAllow(o.BuildAllow); err != nil {
				return usagef("--build-allow: %v", err)
			}
			if o.PipIndexURL != "" {
				if _, err := tbuild.ParsePipIndex(o.PipIndexURL); err != nil {
					return usagef("--pip-index-url: %v", err)
				}
			}
			if o.HTTP.Header < 0 || o.HTTP.Idle < 0 || o.HTTP.BodyIdle < 0 {
				return usagef("--http-*-timeout must not be negative")
			}
			if o.Defaults.Timeout <= 0 || o.MaxSandboxes <= 0 {
				return usagef("--timeout and --max-sandboxes must be above zero")
			}
			if forensicsBudget != "" {
				if o.ForensicsBudget, err = parseBytes(forensicsBudget); err != nil || o.ForensicsBudget <= 0 {
					return usagef("--forensics-budget must be a size above zero such as 500MiB or 2GiB, got %q", forensicsBudget)
				}
			}
			if auditMaxBytes != "" {
				n, err := parseBytes(auditMaxBytes)
				switch {
				case err == nil && n == 0:
					o.AuditMaxBytes = -1
				case err != nil || n < 1<<20:
					return usagef("--audit-max-bytes must be a size of at least 1MiB such as 500MiB or 8GiB, or 0 for no cap, got %q", auditMaxBytes)
				default:
					o.AuditMaxBytes = n
				}
			}
			o.NoAudit = !auditOn
			if o.Cluster, err = cl.options(); err != nil {
				return err
			}
			o.Defaults.CPUs, o.Defaults.MemoryMB, o.Defaults.Pids = limits.CPUs, limits.MemoryBytes>>20, limits.Pids
			o.Defaults.DiskMB, o.Defaults.NoFile = limits.DiskBytes>>20, limits.NoFile
			o.TemplatesDir = templatesDir(o.TemplatesDir, o.DataDir)
			o.APIKey = os.Getenv("FENCE_API_KEY")
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if err := deps.Serve(ctx, o); err != nil {
				return fmt.Errorf("serving: %w", err)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Addr, "addr", DefaultAddr, "listen address (host:port) for the API and sandbox traffic")
	fs.StringVar(&o.DataDir, "data-dir", DefaultDataDir, "directory for the daemon's state")
	fs.StringVar(&o.TemplatesDir, "templates-dir", "", "directory of built templates (default DATA-DIR/templates)")
	fs.StringVar(&o.Domain, "domain", DefaultDomain, "base domain of sandbox hosts ({port}-{id}.DOMAIN)")
	lim.add(fs)
	fs.DurationVar(&o.Defaults.Timeout, "timeout", DefaultTimeout, "default time to live of a sandbox")
	fs.IntVar(&o.MaxSandboxes, "max-sandboxes", DefaultMaxSandboxes, "maximum number of sandboxes alive at once")
	fs.BoolVar(&o.TuneKernel, "tune-kernel", false, "raise kernel.pid_max to 4194304 (as systemd does) and the inotify limits the watch API needs, where they are lower")
	fs.StringVar(&o.TLSCert, "tls-cert", "", "serve HTTPS with this certificate (PEM; a wildcard for *.DOMAIN suits the SDKs)")
	fs.StringVar(&o.TLSKey, "tls-key", "", "private key (PEM) of --tls-cert")
	fs.StringVar(&o.DNSUpstream, "dns-upstream", "", "resolver (ip:port) that answers the sandboxes' allowed DNS queries (default: the host's first nameserver)")
	fs.StringVar(&o.LayerFS, "layer-fs", "", "native layer store: btrfs (writable layers as subvolumes, checkpoints as snapshots, in a btrfs image under the data dir; needs mkfs.btrfs) or copy (default: btrfs if the data dir is on btrfs, else copy)")
	fs.StringVar(&layerFSSize, "layer-fs-size", "32G", "size of the sparse btrfs image of --layer-fs btrfs")
	fs.Int64Var(&netMbps, "net-mbps", 0, "network bandwidth per sandbox and direction, in Mbit/s (0: no limit)")
	fs.BoolVar(&o.AllowInternet, "allow-internet", false, "let sandboxes that ask nothing about their network reach public addresses (default: deny all egress)")
	fs.BoolVar(&o.Inspect, "inspect", false, "let the egress gateway decrypt every name-allowed HTTPS flow and check each request's Host (closes domain fronting; pinned clients need network.passthrough)")
	fs.StringVar(&o.UpstreamCA, "upstream-ca", "", "PEM bundle of roots the egress gateway trusts for upstream servers, instead of the host's")
	fs.StringArrayVar(&denyCIDRs, "deny-cidr", nil, "a range (CIDR or address) no sandbox may ever reach, whatever its policy allows; repeatable")
	fs.StringVar(&o.Backend, "backend", "", "default isolation backend: native (the default) or gvisor; a create picks the other with metadata fence.backend")
	fs.IntVar(&o.WarmPool, "warm-pool", DefaultWarmPool, "sandboxes of the default template (base, else minimal) kept started ahead of requests; 0 disables")
	fs.StringArrayVar(&warmTemplates, "warm-template", nil, "also keep N sandboxes of template NAME started ahead of requests, its start command run and its ready command passed (NAME=N; repeatable; the template must exist when the daemon starts)")
	fs.StringArrayVar(&o.BuildAllow, "build-allow", nil, "also let template build steps reach this allowOut entry (HOST[:PORTS], CIDR[:PORTS], *.DOMAIN, @preset), besides the package registries; repeatable")
	fs.StringVar(&o.PipIndexURL, "pip-index-url", "", "package index (PEP 503) template build steps' pip uses, e.g. an internal mirror; its host is added to the build allowlist")
	fs.DurationVar(&o.HTTP.Header, "http-header-timeout", 0, "time a client has to send a request's headers (default 10s)")
	fs.DurationVar(&o.HTTP.Idle, "http-idle-timeout", 0, "time a keep-alive connection may wait for its next request (default 2m)")
	fs.DurationVar(&o.HTTP.BodyIdle, "http-body-idle-timeout", 0, "time a client may send nothing of a request body (default 1m)")
	fs.StringArrayVar(&o.AuditForward, "audit-forward", nil, "also send every audit record to file:PATH, syslog:HOST:PORT, syslog+tcp:HOST:PORT or https://URL; repeatable")
	fs.DurationVar(&o.AuditRetention, "audit-retention", 0, "how long audit records and kept command output stay (default 168h; negative: forever)")
	fs.StringVar(&auditMaxBytes, "audit-max-bytes", "", "disk the audit records may take, oldest segments pruned first (each removal recorded and signed), e.g. 2GiB (default 8GiB; 0: no cap)")
	fs.DurationVar(&o.ForensicsRetention, "forensics-retention", 0, "how long a killed sandbox's filesystem changes are kept for `fence sandbox export` (default 24h; negative: not kept)")
	fs.StringVar(&forensicsBudget, "forensics-budget", "", "disk the kept filesystem changes may take in all, oldest dropped first, e.g. 500MiB (default 2GiB)")
	fs.BoolVar(&auditOn, "audit", true, "keep the audit trail (off only to measure its cost)")
	cl.add(fs)
	for _, f := range []string{"http-header-timeout", "http-idle-timeout", "http-body-idle-timeout", "audit"} {
		_ = fs.MarkHidden(f)
	}
	return cmd
}

// parseDenyCIDRs parses --deny-cidr values: CIDRs ("10.20.0.0/16",
// "fd00:1::/48") or single addresses.
func parseDenyCIDRs(vals []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range vals {
		s := strings.TrimSpace(v)
		pf, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil || a.Zone() != "" {
				return nil, usagef("--deny-cidr %q: not a CIDR (like 10.20.0.0/16 or fd00:1::/48) or an IP address", v)
			}
			pf = netip.PrefixFrom(a, a.BitLen())
		}
		if pf.Addr().Zone() != "" {
			return nil, usagef("--deny-cidr %q: a zone is not allowed", v)
		}
		out = append(out, pf.Masked())
	}
	return out, nil
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
		Long: `Build a template, an immutable directory tree that sandboxes share
read-only:
  minimal  busybox; builds in seconds, for tests
  base     Debian bookworm with python (3) and pip, node and npm, curl, git,
           sudo and user "user"
  code-interpreter  base plus Jupyter's Python kernel, numpy, pandas and
           matplotlib, and the @e2b/code-interpreter server on port 49999
           (also answers to code-interpreter-v1)
A built-in template is kept unless --force or its definition changed.

With --from-image REF (a registry reference) or --from-archive PATH (an OCI
layout directory or a docker save tarball), NAME is any template name and
the template is unpacked from that image, replacing one of the same name.
Layers are cached and shared between templates. Registry credentials come
from FENCE_REGISTRY_USERNAME and FENCE_REGISTRY_PASSWORD, or
FENCE_REGISTRY_TOKEN. Progress goes to stderr.

With -f, NAME is built from a Dockerfile by the running daemon (E2B's
template build API): every RUN runs in a sandbox, egress limited to the
package registries, layers cached; see docs/TEMPLATES.md.`,
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
				if deps.BuildImageTemplate == nil {
					return errUnavailable("fence template build --from-image")
				}
				if img.Archive != "" {
					img.Ref = archiveRef
				}
				img.Username = os.Getenv("FENCE_REGISTRY_USERNAME")
				img.Password = os.Getenv("FENCE_REGISTRY_PASSWORD")
				img.Token = os.Getenv("FENCE_REGISTRY_TOKEN")
				if err := deps.BuildImageTemplate(cmd.Context(), dataDir, templatesDir(tdir, dataDir), name, img, cmd.ErrOrStderr()); err != nil {
					return fmt.Errorf("building template %s: %w", name, err)
				}
				return nil
			}
			if deps.BuildTemplate == nil {
				return errUnavailable("fence template build")
			}
			if name != "minimal" && name != "base" && name != "code-interpreter" {
				return usagef("unknown template %q: want minimal, base or code-interpreter, or an image with --from-image or --from-archive", name)
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

func benchCmd(deps Deps) *cobra.Command {
	var o BenchOptions
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure sandbox create/exec/kill latency, against peers",
		Long: `Measure fence on this machine, with the peers side by side in the same run:

  - create → exec true → kill, cold (no sandbox of the template ready; the
    backend keeps two sandbox inits started ahead, as the daemon does), and
    its phases (create, exec, kill);
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
    same client on the host; throughput and new-connection time;
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

// parseWarmTemplates parses --warm-template NAME=N values.
func parseWarmTemplates(vals []string) ([]WarmTemplate, error) {
	var out []WarmTemplate
	seen := map[string]bool{}
	for _, v := range vals {
		name, n, ok := strings.Cut(v, "=")
		size, err := strconv.Atoi(n)
		if !ok || name == "" || err != nil || size < 1 || size > 64 {
			return nil, usagef("--warm-template %q: want NAME=N with N between 1 and 64", v)
		}
		if seen[name] {
			return nil, usagef("--warm-template: %s given twice", name)
		}
		seen[name] = true
		out = append(out, WarmTemplate{Name: name, Size: size})
	}
	return out, nil
}
