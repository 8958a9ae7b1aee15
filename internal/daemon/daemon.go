// Package daemon is fence's composition root: it builds the subsystems of
// `fence serve` in order (data dir, API key, templates, isolation backend,
// store, sandbox manager, HTTP API) and tears them down in reverse.
//
// # Guarantees
//
//   - One daemon per data dir: a second one fails at start (flock).
//   - The data dir and templates dir may be symlinks: they are resolved
//     once at start (realPath) and every path is derived from the kernel's
//     spelling, so mount checks, unmounts, runsc's paths and the warm
//     pool's disks agree with what the kernel reports.
//   - On start, whatever a previous, crashed daemon left behind is killed
//     and removed before the API accepts requests.
//   - On SIGTERM (ctx done) the listener stops accepting, every sandbox
//     is killed, in-flight requests get a grace period of 10 seconds, after
//     which their connections are closed (a stuck client does not hold the
//     exit), and the store is closed.
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
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// DefaultAuditMaxBytes is the disk the audit segments may take when
// Config.AuditMaxBytes is zero.
const DefaultAuditMaxBytes = 8 << 30

// Config configures the daemon. It is `fence serve`'s configuration,
// declared here only: each of the command's flags binds to a field (see
// internal/cli), and the daemon's components read it.
type Config struct {
	Addr         string // listen address; required
	DataDir      string // required
	TemplatesDir string // empty means DataDir/templates
	// APIKey is the key clients must present. Empty means the key stored in
	// DataDir/api-key, generated (e2b_ + 40 hex digits) on first start.
	APIKey string
	// Domain is the base domain of per-sandbox hosts ({port}-{id}.{domain}).
	Domain string
	// Defaults are every sandbox's limits and time to live unless its
	// create says otherwise.
	Defaults sandbox.Defaults
	// MaxSandboxes caps the number of sandboxes alive at once.
	MaxSandboxes int
	// MaxLifetime is the longest timeout a create, connect or timeout
	// request may ask for; 0 means 24h, a negative value no cap (the
	// teams' maximum lifetimes still apply).
	MaxLifetime time.Duration
	// TeamLimits are the limits of every team without limits of its own
	// (set through PUT /teams/{teamID}/limits); zero fields limit nothing.
	TeamLimits tenancy.Limits
	// TuneKernel raises kernel.pid_max and the inotify limits at start
	// (capacity.Knobs) where they are below what fence wants.
	TuneKernel bool
	// BuildAllow extends template build steps' egress allowlist
	// (tbuild.DefaultAllow); PipIndexURL is the index their pip uses.
	BuildAllow  []string
	PipIndexURL string
	// WarmPool is how many sandboxes of the default template ("base", or
	// else "minimal") and default limits to keep started ahead of
	// requests. Zero disables the pool.
	WarmPool int
	// WarmTemplates are templates whose sandboxes are also kept started
	// ahead of requests, start command run and ready command passed
	// (name → count, in the order given).
	WarmTemplates []WarmTemplate
	// DNSUpstream is the resolver sandboxes' allowed names are resolved
	// with; empty means the host's first nameserver.
	DNSUpstream string
	// TLSCert and TLSKey, when set, make the listener serve HTTPS (and
	// HTTP/2); both files are PEM.
	TLSCert, TLSKey string
	// SSHAddr, when set, is where the SSH server listens (`ssh ID@host`,
	// see internal/sshd); empty runs none.
	SSHAddr string
	// NoUI turns off the web dashboard at /ui (internal/ui).
	NoUI bool
	// UISessionTTL is the life of a dashboard session; zero means 12 h.
	UISessionTTL time.Duration
	// NetBandwidth bounds each sandbox's traffic in bytes per second per
	// direction; zero means no limit.
	NetBandwidth int64
	// LayerFS is the native layer store: "" (btrfs where the data dir is
	// on btrfs, else copies), "copy", or "btrfs" (a btrfs image of
	// LayerFSSize bytes under the data dir, made and mounted at start).
	LayerFS     string
	LayerFSSize int64
	// AllowInternet is the egress of sandboxes whose request says nothing
	// about their network; false denies all.
	AllowInternet bool
	// Inspect is the egress gateway's default for sandboxes that say
	// nothing about inspection: true terminates every name-allowed TLS
	// flow (fence serve --inspect).
	Inspect bool
	// ApprovalTimeout is how long a sandbox's lookup waits for a person's
	// decision under network approval "ask" before it is refused; zero
	// means 60 s. ApprovalsPerSandbox bounds one sandbox's pending
	// requests; zero means 16.
	ApprovalTimeout     time.Duration
	ApprovalsPerSandbox int
	// UpstreamCA is a PEM file of the roots the egress gateway verifies
	// upstream servers with; empty means the host's.
	UpstreamCA string
	// DenyCIDRs are ranges no sandbox may reach whatever its policy lists
	// (the operator's own networks), on top of the built-in ones.
	DenyCIDRs []netip.Prefix
	// Executable is the static fence binary for sandboxes; empty means the
	// running one.
	Executable string
	// Backend is the default isolation backend: "native" (the default) or
	// "gvisor". The other one is also offered, per create, when it can run
	// here (gvisor needs runsc, see Runsc).
	Backend string
	// Runsc is the runsc binary of the gvisor backend; empty means
	// $FENCE_RUNSC, else /var/lib/fence/cache/runsc/runsc.
	Runsc  string
	Logger *slog.Logger // nil discards
	// Stdout receives the start-up lines meant for the operator (where the
	// API key is, the address). Nil discards.
	Stdout io.Writer
	// Ready, if set, is called with the listener's address once the API
	// accepts requests.
	Ready func(addr net.Addr)
	// HTTP bounds the API server's waits on clients; zero fields take the
	// defaults of HTTPTimeouts.
	HTTP HTTPTimeouts
	// AuditForward are destinations every audit record is also sent to
	// (see audit.Log.Forward).
	AuditForward []string
	// AuditRetention is how long audit records and kept command output
	// stay; zero means 7 days, negative forever.
	AuditRetention time.Duration
	// AuditMaxBytes caps the audit segments on disk, oldest pruned first
	// (audit.Options.MaxBytes); zero means DefaultAuditMaxBytes, negative
	// no cap.
	AuditMaxBytes int64
	// ForensicsRetention is how long the writable layer of a killed
	// sandbox is kept for export (DATA-DIR/forensics); zero means
	// forensics.DefaultRetention, negative keeps none.
	ForensicsRetention time.Duration
	// ForensicsBudget bounds the kept layers in all, oldest dropped first;
	// zero means forensics.DefaultBudget.
	ForensicsBudget int64
	// NoAudit keeps no audit trail (for measuring its cost only).
	NoAudit bool
	// Cluster, if set, makes the daemon a node of a fence cluster.
	Cluster *ClusterOptions
	// Database, if set, is the PostgreSQL URL (postgres://…) of the
	// records every node of a cluster shares: teams, keys, limits, quota
	// reservations, secrets (store.Options.DatabaseURL). Empty keeps them
	// in DataDir/fence.db with the rest.
	Database string
	// DrainMoves, on a cluster node with Database and Registry, moves the
	// node's sandboxes into the registry when the operator drains it
	// (fence.dev/drain=true on its Lease); their next connect or resume
	// takes them over on another node (internal/snapreg).
	DrainMoves bool
	// SecretsKey is the file of the key sealing secrets; empty means
	// DataDir/secrets.key. With Database it must exist (every node reads
	// the cluster's one key): it is never made then.
	SecretsKey string
	// Registry, if set (with Database), is the cluster's content
	// registry: templates built and snapshots taken on a node are pushed
	// to it and pulled by the others (docs/CLUSTER.md).
	Registry *RegistryOptions
}

// RegistryOptions locate the cluster's content registry
// (contentreg.Options).
type RegistryOptions struct {
	URL                string // host[:port]/path-prefix
	CAFile             string
	Username, Password string
}

// HTTPTimeouts bound how long the API server waits on a client. There is
// deliberately no bound on writing a response: process output, PTYs and
// watches stream for as long as the client reads.
type HTTPTimeouts struct {
	// Header bounds reading a request's headers; zero means 10 seconds.
	Header time.Duration
	// Idle closes a keep-alive connection that waits this long for its next
	// request; zero means 2 minutes.
	Idle time.Duration
	// BodyIdle bounds each wait for more of a request body (a long upload
	// that keeps moving is never cut); zero means 1 minute.
	BodyIdle time.Duration
}

func (t HTTPTimeouts) withDefaults() HTTPTimeouts {
	if t.Header <= 0 {
		t.Header = 10 * time.Second
	}
	if t.Idle <= 0 {
		t.Idle = 2 * time.Minute
	}
	if t.BodyIdle <= 0 {
		t.BodyIdle = time.Minute
	}
	return t
}

// apiKeyPattern matches e2b_ and at least 20 hex digits (the minimum
// checked apart, see validKey: a bounded repetition compiles into a copy of
// the class per repetition, at every start of the binary).
var apiKeyPattern = regexp.MustCompile(`^e2b_[0-9a-f]+$`)

func validKey(k string) bool { return len(k) >= len("e2b_")+20 && apiKeyPattern.MatchString(k) }

// readyInits is how many sandbox inits the native backend keeps started
// ahead of creates (native.Options.ReadyInits): a cold create then waits
// for neither the namespaces' clone nor the init's start.
const readyInits = 2

// Serve runs the daemon until ctx is done.
//
// The daemon is a graph of components (see components), each made from
// what the ones it requires made, started in dependency order; each pushes
// its teardown on one closer stack, which runs in reverse order when Serve
// returns, whether it returns after a clean shutdown, a failed start or a
// panic.
func Serve(ctx context.Context, opts Config) error {
	if opts.DataDir == "" || opts.Addr == "" {
		return errors.New("daemon: Addr and DataDir are required")
	}
	d := &node{opts: opts, log: opts.Logger, out: opts.Stdout}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.out == nil {
		d.out = io.Discard
	}
	return d.run(ctx, components, d.serve)
}

// lockWait is how long a starting daemon waits for the data dir's lock.
var lockWait = 10 * time.Second

// lockDataDir makes sure one daemon owns the data dir.
func lockDataDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "daemon.lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking data dir: %w", err)
	}
	// A daemon killed a moment ago may still be exiting (a kill -9 waits
	// for an unfinished mount or cgroup call): give it a few seconds.
	for deadline := time.Now().Add(lockWait); ; {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("data dir %s is in use by another fence serve", dir)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// apiKey returns the key to require and, when it lives in a file, where.
func apiKey(opts Config) (key, path string, err error) {
	if opts.APIKey != "" {
		return opts.APIKey, "", nil
	}
	path = filepath.Join(opts.DataDir, "api-key")
	b, err := os.ReadFile(path)
	if err == nil {
		// The key file is root's alone, also when an older version or a
		// hand-made file left it wider.
		if err := os.Chmod(path, 0o600); err != nil {
			return "", "", fmt.Errorf("restricting API key: %w", err)
		}
		key = strings.TrimSpace(string(b))
		if !validKey(key) {
			return "", "", fmt.Errorf("%s does not hold a valid key (e2b_ + hex digits)", path)
		}
		return key, path, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", "", fmt.Errorf("reading API key: %w", err)
	}
	raw := make([]byte, 20)
	if _, err := rand.Read(raw); err != nil {
		return "", "", err
	}
	key = "e2b_" + hex.EncodeToString(raw)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(key+"\n"), 0o600); err != nil {
		return "", "", fmt.Errorf("writing API key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", "", fmt.Errorf("writing API key: %w", err)
	}
	return key, path, nil
}

// WarmTemplate is Size sandboxes of template Name kept started ahead of
// requests.
type WarmTemplate struct {
	Name string
	Size int
	// IfBuilt starts the pool only when the template is built, instead
	// of failing the daemon's start (a default pool, not one asked for).
	IfBuilt bool
}
