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
//   - On SIGTERM (ctx done) the listener stops accepting, in-flight
//     requests get a grace period, every sandbox is killed and the store is
//     closed.
package daemon

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/btrfs"
	"github.com/fencesandbox/fence/internal/capacity"
	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/downloads"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/forensics"
	"github.com/fencesandbox/fence/internal/hostaddr"
	"github.com/fencesandbox/fence/internal/httpapi"
	"github.com/fencesandbox/fence/internal/httpserve"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/multi"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/isolation/warm"
	"github.com/fencesandbox/fence/internal/metrics"
	"github.com/fencesandbox/fence/internal/oci"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/export"
	"github.com/fencesandbox/fence/internal/secrets"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/sysmon"
	"github.com/fencesandbox/fence/internal/tbuild"
	"github.com/fencesandbox/fence/internal/template"
)

// DefaultAuditMaxBytes is the disk the audit segments may take when
// Options.AuditMaxBytes is zero.
const DefaultAuditMaxBytes = 8 << 30

// Options configures the daemon.
type Options struct {
	Addr         string // listen address; required
	DataDir      string // required
	TemplatesDir string // empty means DataDir/templates
	// APIKey is the key clients must present. Empty means the key stored in
	// DataDir/api-key, generated (e2b_ + 40 hex digits) on first start.
	APIKey       string
	Domain       string
	Defaults     sandbox.Defaults
	MaxSandboxes int
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
	// NetBandwidth bounds each sandbox's traffic in bytes per second per
	// direction; zero means no limit.
	NetBandwidth int64
	// LayerFS and LayerFSSize choose the native layer store (see
	// cli.Options).
	LayerFS     string
	LayerFSSize int64
	// AllowInternet is the egress of sandboxes whose request says nothing
	// about their network; false denies all.
	AllowInternet bool
	// Inspect is the egress gateway's default for sandboxes that say
	// nothing about inspection: true terminates every name-allowed TLS
	// flow (fence serve --inspect).
	Inspect bool
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
func Serve(ctx context.Context, opts Options) error {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	out := opts.Stdout
	if out == nil {
		out = io.Discard
	}
	if opts.DataDir == "" || opts.Addr == "" {
		return errors.New("daemon: Addr and DataDir are required")
	}
	// One spelling of each, the kernel's, for every path derived below.
	var err error
	if opts.DataDir, opts.TemplatesDir, err = resolveDirs(opts.DataDir, opts.TemplatesDir); err != nil {
		return err
	}
	// Before anything is made: a binary sandboxes cannot run is a clear
	// error at start, not a failure of every create.
	exe := opts.Executable
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return fmt.Errorf("finding own executable: %w", err)
		}
	}
	if err := native.CheckExecutable(exe); err != nil {
		return err
	}
	// The runtime's monitor thread polls less (package sysmon).
	rctx, stopRelax := context.WithCancel(ctx)
	defer stopRelax()
	go func() {
		if err := sysmon.Relax(rctx, "/proc", sysmon.Default, sysmon.KeepEvery); err != nil {
			log.Debug("leaving the runtime's monitor thread as it is", "err", err)
		}
	}()
	if opts.Cluster != nil {
		if err := opts.Cluster.validate(); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(opts.DataDir, 0o711); err != nil {
		return fmt.Errorf("creating data dir: %w", err)
	}
	unlock, err := lockDataDir(opts.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	// The audit trail, open before anything it records and closed after
	// everything else (its Close commits the queue and signs the tail).
	// auditLog is the audit.Sink the event sources append to.
	auditLog, err := audit.Open(audit.Options{Dir: opts.DataDir, Logger: log, Retention: opts.AuditRetention,
		MaxBytes: max(0, cmp.Or(opts.AuditMaxBytes, DefaultAuditMaxBytes))})
	if err != nil {
		return fmt.Errorf("opening audit log: %w", err)
	}
	var forwarders []*audit.Forwarder
	defer func() {
		auditLog.Close()
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, f := range forwarders {
			f.Wait(fctx) // what is left is sent at the next start
			f.Close()
		}
	}()
	for _, dest := range opts.AuditForward {
		f, err := auditLog.Forward(dest)
		if err != nil {
			return err
		}
		forwarders = append(forwarders, f)
	}

	key, keyPath, err := apiKey(opts)
	if err != nil {
		return err
	}
	if keyPath != "" {
		fmt.Fprintf(out, "fence: API key in %s\n", keyPath)
	}
	if err := tuneAndReportKernel(opts.TuneKernel, opts.MaxSandboxes, out, log); err != nil {
		return err
	}
	templates, err := template.New(template.Options{Dir: opts.TemplatesDir, Logger: log})
	if err != nil {
		return fmt.Errorf("opening templates: %w", err)
	}
	if err := native.CleanupStale(ctx, filepath.Join(opts.DataDir, "native"), opts.Executable, log); err != nil {
		log.Warn("cleaning up after earlier fence run processes", "err", err)
	}
	// The host's addresses are followed as interfaces change, not only
	// read once: an address gained later is never reachable either.
	hosts, err := hostaddr.Watch(ctx)
	if err != nil {
		return fmt.Errorf("watching the host's addresses: %w", err)
	}
	defer hosts.Close()
	reg := metrics.New()
	netShared := egress.NewShared(egress.SharedOptions{})
	hostAddrs := hosts.Addrs() // never reachable from a sandbox
	registerNetMetrics(reg, netShared)
	reg.CounterFunc("fence_audit_suppressed_total", "Sandbox-driven audit events over their sandbox's allowance, counted in audit.suppressed records instead of stored one by one.", auditLog.Suppressed)
	reg.CounterFunc("fence_audit_dropped_total", "Audit events dropped because the queue stayed full (each counted in an audit.dropped record).", auditLog.Dropped)
	st, err := store.Open(ctx, filepath.Join(opts.DataDir, "fence.db"))
	if err != nil {
		return fmt.Errorf("opening store: %w", err)
	}
	defer st.Close()
	// The secret store and the download log live in the same database:
	// the egress gateway reads secrets from one and records downloads in
	// the other.
	secretStore, err := secrets.Open(secrets.Options{DB: st, KeyPath: filepath.Join(opts.DataDir, "secrets.key")})
	if err != nil {
		return fmt.Errorf("opening secret store: %w", err)
	}
	downloadLog, err := downloads.Open(ctx, st, downloads.Options{})
	if err != nil {
		return fmt.Errorf("opening download log: %w", err)
	}
	flows := newFlowRecorder(log, reg)
	// sources are what the event sources get: the log, or nothing with
	// NoAudit (the log stays open, empty, for a clean start and stop).
	sources := auditSources(auditLog, opts.NoAudit)
	flows.audit = sources.sink
	var archive *forensics.Archive
	if opts.ForensicsRetention >= 0 {
		if archive, err = forensics.OpenArchive(filepath.Join(opts.DataDir, "forensics"),
			cmp.Or(opts.ForensicsRetention, forensics.DefaultRetention), opts.ForensicsBudget); err != nil {
			return err
		}
		go archive.PruneEvery(ctx, 10*time.Minute)
	}
	// The egress gateway: its CA lives in the data dir (key 0600, never in
	// a sandbox); every sandbox trusts the CA's certificate. mgr is set
	// below, before any sandbox can be handed out.
	var mgr *sandbox.Manager
	gwRec := newGatewayRecorder(flows, log, reg, downloadLog)
	gwRec.audit = sources.sink
	defer gwRec.close()
	gw, caPEM, err := newGateway(opts, secretStore, gwRec, log)
	if err != nil {
		return err
	}
	layerFS := ""
	if opts.LayerFS == "btrfs" {
		layerFS = filepath.Join(opts.DataDir, "native", "layerfs")
		if err := btrfs.MountImage(ctx, filepath.Join(opts.DataDir, "layerfs.img"), layerFS, opts.LayerFSSize); err != nil {
			return fmt.Errorf("preparing the btrfs layer store: %w", err)
		}
	}
	backend, err := native.New(ctx, native.Options{
		LayerFS:    layerFS,
		CopyLayers: opts.LayerFS == "copy",
		TrustedCA:  caPEM,
		StateDir:   filepath.Join(opts.DataDir, "native"),
		FenceDirs:  []string{opts.DataDir, opts.TemplatesDir},
		Executable: opts.Executable,
		DiskPool:   4,
		ReadyInits: readyInits,
		Forensics:  archive,
		Defaults:   opts.Defaults.Limits(),
		Logger:     log,
	})
	if err != nil {
		return fmt.Errorf("starting native backend: %w", err)
	}
	defer backend.Close()
	routed, closeBackends, err := withGvisor(ctx, opts, backend, caPEM, log)
	if err != nil {
		return err
	}
	defer closeBackends()
	layers := isolation.Layers(backend)
	if r, ok := routed.(*multi.Backend); ok {
		layers = r.Layers() // native's and gvisor's, each layer to its own
	}
	pool, tmplPools, layers := backendStack(routed, layers, opts, log)
	defer func() {
		for _, p := range append([]*warm.Pool{pool}, tmplPools...) {
			p.Close(context.WithoutCancel(ctx))
		}
	}()
	// Template builds: their trees and uploads live in the data dir; the
	// images they start from come from the shared layer cache.
	var images tbuild.Images
	if c, err := oci.NewCache(filepath.Join(opts.DataDir, "oci")); err == nil {
		images = c
	} else {
		log.Info("building templates from images is not available", "err", err)
	}
	var pipIndex *tbuild.PipIndex
	if opts.PipIndexURL != "" {
		if pipIndex, err = tbuild.ParsePipIndex(opts.PipIndexURL); err != nil {
			return err
		}
	}
	builds, err := tbuild.New(ctx, tbuild.Options{Dir: filepath.Join(opts.DataDir, "builds"), Store: st,
		Parents: templates, Images: images, Logger: log,
		Allow: append(slices.Clone(tbuild.DefaultAllow), opts.BuildAllow...), PipIndex: pipIndex})
	if err != nil {
		return fmt.Errorf("opening template builds: %w", err)
	}
	defer builds.Close()
	gate, err := capacity.New(capacity.Options{Source: capacitySource(opts, backend)})
	if err != nil {
		return err
	}
	registerCapacityMetrics(reg, gate)
	mgr, err = sandbox.New(sandbox.Options{
		Capacity:     gate,
		Backend:      pool,
		Store:        st,
		Templates:    templateSet{own: templates, built: builds},
		Defaults:     opts.Defaults,
		MaxSandboxes: opts.MaxSandboxes,
		Logger:       log,

		AllowInternetByDefault: opts.AllowInternet,
		InspectByDefault:       opts.Inspect,
		Audit:                  sources.sink,
		Secrets:                secretStore,
		Sealer:                 secretStore,
		CAEnv:                  native.CAEnv(),
		HostAddrs:              hostAddrs,
		Fence:                  fenceConfig(opts, gw, &mgr, flows, netShared, hostAddrs, log),
		Hosts:                  hosts,
		NeverCIDRs:             opts.DenyCIDRs,
		Layers:                 layers,
	})
	if err != nil {
		return fmt.Errorf("creating sandbox manager: %w", err)
	}
	builds.SetSandboxes(mgr)
	flows.usage = mgr.Meter().AddEgress
	registerUsageMetrics(reg, mgr)
	reg.GaugeFunc("fence_sandboxes_running", "Sandboxes running.", func() int64 { return int64(mgr.Running()) })
	reg.GaugeFunc("fence_sandboxes_paused", "Sandboxes paused (they hold their memory).", func() int64 { return int64(mgr.Paused()) })
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("starting sandbox manager: %w", err)
	}
	// Only the default template with the default limits is pooled, and
	// every pooled sandbox counts against --max-sandboxes.
	for _, name := range []string{"base", "minimal"} {
		if rootfs, err := templates.Resolve(name); err == nil {
			pool.Start(warm.Target{RootFS: rootfs, Limits: mgr.DefaultLimits(), Network: mgr.PoolNetwork()}, mgr.PoolBudget())
			break
		}
	}
	shutdownSandboxes := func() {
		builds.Close() // builds end canceled, not by their sandboxes' kill
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for _, p := range append([]*warm.Pool{pool}, tmplPools...) {
			if err := p.Close(sctx); err != nil {
				log.Error("shutting down the warm pool", "err", err)
			}
		}
		if err := mgr.Shutdown(sctx); err != nil {
			log.Error("shutting down sandboxes", "err", err)
		}
	}
	defer shutdownSandboxes() // idempotent; covers the early returns
	reg.GaugeFunc("fence_sandboxes_warm_ready", "Sandboxes started ahead of requests, ready to hand out (the default template's and --warm-template's).", func() int64 {
		n := pool.Ready()
		for _, p := range tmplPools {
			n += p.Ready()
		}
		return int64(n)
	})
	for i, wt := range opts.WarmTemplates {
		t, err := mgr.WarmTarget(wt.Name)
		if err != nil {
			return fmt.Errorf("--warm-template %s: %w", wt.Name, err)
		}
		tmplPools[i].Start(t, mgr.PoolBudget())
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", opts.Addr, err)
	}
	timeouts := opts.HTTP.withDefaults()
	var handler http.Handler = httpapi.New(httpapi.Options{
		Manager:         mgr,
		APIKey:          key,
		Domain:          opts.Domain,
		Logger:          log,
		Metrics:         reg.Handler(),
		BodyIdleTimeout: timeouts.BodyIdle,
		Secrets:         secretStore,
		Downloads:       downloadLog,
		Audit:           sources.log,
		Outputs:         sources.outputs,
		Templates:       builds,
		Exporter: export.New(export.Options{Live: mgr, Usage: mgr.Meter(), Audit: sources.sink,
			Archive: layerArchive(archive), Backend: pool.Name()}),
	})
	if opts.Cluster != nil {
		handler = cluster.RequireToken(opts.Cluster.Token, handler)
	}
	srv, err := httpserve.New(httpserve.Options{
		Handler:       handler,
		Logger:        log,
		HeaderTimeout: timeouts.Header,
		IdleTimeout:   timeouts.Idle,
		TLSCert:       opts.TLSCert,
		TLSKey:        opts.TLSKey,
	})
	if err != nil {
		ln.Close()
		return err
	}
	scheme := httpserve.Scheme(srv)
	var lease *cluster.Registrar
	if opts.Cluster != nil {
		url, err := opts.Cluster.advertised(scheme, ln.Addr())
		if err != nil {
			ln.Close()
			return err
		}
		regCtx, stopReg := context.WithCancel(ctx)
		defer stopReg()
		if lease, err = joinCluster(regCtx, opts.Cluster, url, mgr, opts.MaxSandboxes, templates, log); err != nil {
			ln.Close()
			return err
		}
		fmt.Fprintf(out, "fence: node %s (tag %s) joined the cluster in namespace %s as %s\n",
			opts.Cluster.Name, cluster.Tag(opts.Cluster.Name), opts.Cluster.Namespace, url)
	}
	fmt.Fprintf(out, "fence: serving the E2B API on %s://%s (data in %s)\n", scheme, ln.Addr(), opts.DataDir)
	if opts.Ready != nil {
		opts.Ready(ln.Addr())
	}
	if err := httpserve.Serve(ctx, srv, ln); err != nil {
		return err
	}
	fmt.Fprintln(out, "fence: shutting down")
	if lease != nil {
		// Routers stop placing here before the sandboxes go.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := lease.Drain(dctx); err != nil {
			log.Warn("publishing the node's drain", "err", err)
		}
		cancel()
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := lease.Release(rctx); err != nil {
				log.Warn("releasing the node's lease", "err", err)
			}
		}()
	}
	// Killing the sandboxes first aborts the streams to them, so the
	// server's drain that follows is short.
	shutdownSandboxes()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
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
func apiKey(opts Options) (key, path string, err error) {
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
}
