package cli

import (
	"context"
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
	DefaultMaxLifetime  = 24 * time.Hour
	DefaultMaxSandboxes = 1000
	DefaultWarmPool     = 2
)

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
	// Ask, when set, is network approval "ask" (`fence run --ask`): a
	// lookup of a name the sandbox may not reach waits for it and proceeds
	// if it returns true.
	Ask func(ctx context.Context, name string) bool
	// DNSUpstream is the resolver of the sandbox's allowed lookups
	// (ip:port); "" is the host's.
	DNSUpstream string
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
