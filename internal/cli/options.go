package cli

import (
	"net/netip"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/selftest"
)

// Defaults shared by the verbs.
const (
	DefaultAddr         = "127.0.0.1:3000"
	DefaultURL          = "http://" + DefaultAddr
	DefaultDataDir      = "/var/lib/fence"
	DefaultDomain       = "localhost"
	DefaultCPUs         = 1.0
	DefaultMemoryMB     = 512
	DefaultPids         = 1024
	DefaultDiskMB       = 1024
	DefaultNoFile       = 1024
	DefaultTimeout      = 5 * time.Minute
	DefaultMaxSandboxes = 1000
	DefaultWarmPool     = 2
)

// ServeOptions configures `fence serve`.
type ServeOptions struct {
	// Addr is the listen address of the API and sandbox traffic.
	Addr string
	// DataDir holds the daemon's state (database, sandboxes, api-key).
	DataDir string
	// TemplatesDir holds the built templates; DataDir/templates by default.
	TemplatesDir string
	// APIKey is the key clients must send. Empty means the daemon uses the
	// key stored in DataDir/api-key, generating it on first start.
	APIKey string
	// Domain is the base domain of per-sandbox hosts ({port}-{id}.{domain}).
	Domain string
	// Limits are the per-sandbox defaults.
	Limits isolation.Limits
	// Backend is the default isolation backend ("native" or "gvisor").
	Backend string
	// Timeout is the default sandbox time to live.
	Timeout time.Duration
	// MaxSandboxes caps the number of sandboxes alive at once.
	MaxSandboxes int
	// TuneKernel raises kernel.pid_max and the inotify limits at start.
	TuneKernel bool
	// TLSCert and TLSKey, when both set, make the daemon serve HTTPS (a
	// wildcard certificate for *.DOMAIN lets the SDKs reach sandboxes at
	// https://PORT-ID.DOMAIN without E2B_SANDBOX_URL).
	TLSCert, TLSKey string
	// DNSUpstream is the resolver ("ip:port") the daemon asks on the
	// sandboxes' behalf; empty means the host's first nameserver.
	DNSUpstream string
	// NetMbps bounds each sandbox's network traffic in Mbit/s per
	// direction; 0 means no limit.
	NetMbps int64
	// LayerFS is the native layer store: "" (btrfs where the data dir is
	// on btrfs, else copies), "copy", or "btrfs" (a btrfs image of
	// LayerFSSize bytes under the data dir, made and mounted at start).
	LayerFS     string
	LayerFSSize int64
	// AllowInternet makes sandboxes whose request says nothing about their
	// network reach the public internet; false denies all egress.
	AllowInternet bool
	// Inspect makes the egress gateway terminate every name-allowed TLS
	// flow of sandboxes whose network says nothing about inspection.
	Inspect bool
	// UpstreamCA is a PEM bundle the egress gateway verifies upstream
	// servers against instead of the host's roots.
	UpstreamCA string
	// WarmPool is how many sandboxes of the default template and limits to
	// keep started ahead of requests (0 disables).
	WarmPool int
	// WarmTemplates keeps sandboxes of these templates started ahead of
	// requests too, each with its start command run and its ready command
	// passed.
	WarmTemplates []WarmTemplate
	// BuildAllow extends the template build steps' egress allowlist (the
	// package registries' presets) with allowOut entries; PipIndexURL is
	// the package index build steps' pip is pointed at (its host joins
	// the allowlist).
	BuildAllow  []string
	PipIndexURL string
	// DenyCIDRs are ranges no sandbox may ever reach, whatever its policy
	// lists (the operator's own networks).
	DenyCIDRs []netip.Prefix
	// HeaderTimeout, IdleTimeout and BodyIdleTimeout bound the API server's
	// waits on clients (request headers, keep-alive, each read of a
	// body); zero takes the daemon's defaults. Hidden flags, for tests.
	HeaderTimeout, IdleTimeout, BodyIdleTimeout time.Duration
	// AuditForward are destinations every audit record is also sent to
	// (file:PATH, syslog:HOST:PORT, syslog+tcp:HOST:PORT, https://URL).
	AuditForward []string
	// AuditRetention is how long audit segments and kept command output
	// stay; zero means 7 days, negative forever.
	AuditRetention time.Duration
	// AuditMaxBytes caps the audit segments on disk; zero means the
	// daemon's default (8 GiB), negative no cap.
	AuditMaxBytes int64
	// ForensicsRetention is how long killed sandboxes' layers are kept for
	// export (zero: 24h; negative: none); ForensicsBudget bounds them in
	// all (zero: 2 GiB). NoAudit keeps no audit trail (hidden, to measure
	// its cost).
	ForensicsRetention time.Duration
	ForensicsBudget    int64
	NoAudit            bool
	// Cluster, if set, joins the daemon to a fence cluster.
	Cluster *ClusterOptions
}

// LocalOptions configures a sandbox started without a daemon (`fence run`).
type LocalOptions struct {
	DataDir      string
	TemplatesDir string // DataDir/templates by default
	Template     string // template name, e.g. "minimal"
	// Timeout kills the sandbox after this long; zero means no limit.
	Timeout time.Duration
	// Binds are host paths mounted into the sandbox, validated by the CLI.
	Binds   []isolation.Bind
	Workdir string            // default working directory; "" = the template's
	Env     map[string]string // sandbox-wide environment (only what -e gave)
	Limits  isolation.Limits
	// Backend is the isolation backend ("native", the default, or "gvisor").
	Backend string
	// OnFlow, when set, receives each decision of the sandbox's network
	// stack (`fence selftest` judges its network checks by them).
	OnFlow func(selftest.Flow)
}

// BenchOptions configures `fence bench`.
type BenchOptions struct {
	Iterations   int
	Template     string
	DataDir      string
	TemplatesDir string
	// Peers also runs the peer runtimes found on the machine (bwrap, crun,
	// runc, …) in the same run, for comparison.
	Peers bool
	// Density, when above zero, also creates that many idle sandboxes
	// through the API and reports create rate, memory and liveness.
	Density int
	// NetMiB is the size of the network measure's download; 0 skips it.
	NetMiB int
}

func defaultLimits() isolation.Limits {
	return isolation.Limits{
		CPUs:        DefaultCPUs,
		MemoryBytes: DefaultMemoryMB << 20,
		Pids:        DefaultPids,
		DiskBytes:   DefaultDiskMB << 20,
		NoFile:      DefaultNoFile,
	}
}

// WarmTemplate is one --warm-template: Size sandboxes of template Name.
type WarmTemplate struct {
	Name string
	Size int
}
