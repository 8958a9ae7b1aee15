package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fencesandbox/fence/internal/approvals"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/btrfs"
	"github.com/fencesandbox/fence/internal/capacity"
	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/contentreg"
	"github.com/fencesandbox/fence/internal/downloads"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/forensics"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/hostaddr"
	"github.com/fencesandbox/fence/internal/httpapi"
	"github.com/fencesandbox/fence/internal/httpserve"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/multi"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/isolation/warm"
	"github.com/fencesandbox/fence/internal/mcp"
	"github.com/fencesandbox/fence/internal/metrics"
	"github.com/fencesandbox/fence/internal/oci"
	"github.com/fencesandbox/fence/internal/quota"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/export"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
	"github.com/fencesandbox/fence/internal/sandbox/idle"
	"github.com/fencesandbox/fence/internal/sandbox/timetravel"
	"github.com/fencesandbox/fence/internal/secrets"
	"github.com/fencesandbox/fence/internal/snapreg"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/sysmon"
	"github.com/fencesandbox/fence/internal/tbuild"
	"github.com/fencesandbox/fence/internal/template"
	"github.com/fencesandbox/fence/internal/tenancy"
	"github.com/fencesandbox/fence/internal/ui"
	"github.com/fencesandbox/fence/internal/volume"
)

// node is the daemon being assembled: what each component made, for the
// components after it. A component reads only fields set by the
// components it requires (directly or through them).
type node struct {
	opts    Config
	log     *slog.Logger
	out     io.Writer
	closers closers

	auditLog *audit.Log
	sources  sourcesOf // the audit log as the event sources see it
	key      string    // the API key clients must present

	templates *template.Store
	hosts     *hostaddr.Set
	hostAddrs []netip.Addr
	reg       *metrics.Registry
	netShared *egress.Shared
	st        *store.Store
	secrets   *secrets.Store
	downloads *downloads.Log
	flows     *flowRecorder
	archive   *forensics.Archive
	gw        *gateway.Gateway
	caPEM     []byte
	native    *native.Backend
	routed    isolation.Backend
	pool      *warm.Pool   // the default template's
	tmplPools []*warm.Pool // --warm-template's, in its order
	layers    isolation.Layers
	builds    *tbuild.Service // template records and the catalog the manager resolves with
	gate      *capacity.Gate
	nets      *fences.Set // the sandboxes' network side
	approvals *approvals.Queue
	mgr       *sandbox.Manager
	keeper    *timetravel.Keeper // snapshots, forks, checkpoints (the manager's Options.Keeper)
	moves     *snapreg.Store     // snapshots and moves through the registry; nil without one
	idle      *idle.Tracker      // the sandboxes' use, for the idle pause (the manager's Options.Idle)
	runner    *tbuild.Runner     // the builds run in mgr's sandboxes
	quotas    *tenancy.Quotas    // the teams' limits and what their sandboxes take
	admission tenancy.Admission  // quotas, or over them the cluster's (clusterquota)
	volumes   *volume.Service    // nil where this host cannot make volumes
}

// components are the daemon's parts, listed in an order their
// requirements allow (the order they start in, see order).
var components = []component{
	{"paths", nil, (*node).resolvePaths},
	{"runtime", nil, (*node).relaxRuntime},
	{"data dir", []string{"paths"}, (*node).lockDataDir},
	{"audit", []string{"data dir"}, (*node).openAudit},
	{"api key", []string{"data dir"}, (*node).loadAPIKey},
	{"kernel", nil, (*node).tuneKernel},
	{"templates", []string{"data dir"}, (*node).openTemplates},
	{"host addresses", []string{"audit"}, (*node).watchHosts},
	{"store", []string{"data dir", "audit", "host addresses"}, (*node).openStore},
	{"forensics", []string{"data dir"}, (*node).openForensics},
	{"gateway", []string{"store", "audit", "host addresses"}, (*node).startGateway},
	{"backends", []string{"gateway", "forensics"}, (*node).startBackends},
	{"builds", []string{"store", "templates"}, (*node).openBuilds},
	{"quotas", []string{"store"}, (*node).openQuotas},
	{"volumes", []string{"store"}, (*node).openVolumes},
	{"sandboxes", []string{"backends", "builds", "templates", "store", "gateway", "audit", "host addresses", "quotas"}, (*node).startSandboxes},
	{"warm pools", []string{"sandboxes", "templates"}, (*node).startWarmPools},
}

// resolvePaths gives the data and templates dirs one spelling each, the
// kernel's, for every path derived below, and checks the binary
// sandboxes run before anything is made: a binary they cannot run is a
// clear error at start, not a failure of every create.
func (d *node) resolvePaths(ctx context.Context) error {
	var err error
	if d.opts.DataDir, d.opts.TemplatesDir, err = resolveDirs(d.opts.DataDir, d.opts.TemplatesDir); err != nil {
		return err
	}
	exe := d.opts.Executable
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return fmt.Errorf("finding own executable: %w", err)
		}
	}
	return native.CheckExecutable(exe)
}

// relaxRuntime makes the runtime's monitor thread poll less (package
// sysmon) while the daemon runs.
func (d *node) relaxRuntime(ctx context.Context) error {
	rctx, stop := context.WithCancel(ctx)
	d.closers.push(stop)
	go func() {
		if err := sysmon.Relax(rctx, "/proc", sysmon.Default, sysmon.KeepEvery); err != nil {
			d.log.Debug("leaving the runtime's monitor thread as it is", "err", err)
		}
	}()
	if d.opts.Cluster != nil {
		return d.opts.Cluster.validate()
	}
	return nil
}

// lockDataDir makes the data dir and takes its lock: one daemon per dir.
func (d *node) lockDataDir(ctx context.Context) error {
	if err := os.MkdirAll(d.opts.DataDir, 0o711); err != nil {
		return fmt.Errorf("creating data dir: %w", err)
	}
	unlock, err := lockDataDir(d.opts.DataDir)
	if err != nil {
		return err
	}
	d.closers.push(unlock)
	return nil
}

// openAudit opens the audit trail, before anything it records, and closes
// it after everything else (its Close commits the queue and signs the
// tail); then its forwarders get a last chance to send.
func (d *node) openAudit(ctx context.Context) error {
	o := d.opts
	l, err := audit.Open(audit.Options{Dir: o.DataDir, Logger: d.log, Retention: o.AuditRetention,
		MaxBytes: max(0, cmp.Or(o.AuditMaxBytes, DefaultAuditMaxBytes))})
	if err != nil {
		return fmt.Errorf("opening audit log: %w", err)
	}
	d.auditLog = l
	var forwarders []*audit.Forwarder
	d.closers.push(func() {
		l.Close()
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, f := range forwarders {
			f.Wait(fctx) // what is left is sent at the next start
			f.Close()
		}
	})
	for _, dest := range o.AuditForward {
		f, err := l.Forward(dest)
		if err != nil {
			return err
		}
		forwarders = append(forwarders, f)
	}
	// What the event sources get: the log, or nothing with NoAudit (the
	// log stays open, empty, for a clean start and stop).
	d.sources = auditSources(l, o.NoAudit)
	return nil
}

// loadAPIKey finds (or makes) the API key and says where it lives.
func (d *node) loadAPIKey(ctx context.Context) error {
	key, keyPath, err := apiKey(d.opts)
	if err != nil {
		return err
	}
	d.key = key
	if keyPath != "" {
		fmt.Fprintf(d.out, "fence: API key in %s\n", keyPath)
	}
	return nil
}

func (d *node) tuneKernel(ctx context.Context) error {
	return tuneAndReportKernel(d.opts.TuneKernel, d.opts.MaxSandboxes, d.out, d.log)
}

// openTemplates opens the template store and removes what a crashed
// daemon's native sandboxes left behind.
func (d *node) openTemplates(ctx context.Context) error {
	t, err := template.New(template.Options{Dir: d.opts.TemplatesDir, Logger: d.log})
	if err != nil {
		return fmt.Errorf("opening templates: %w", err)
	}
	d.templates = t
	if err := native.CleanupStale(ctx, filepath.Join(d.opts.DataDir, "native"), d.opts.Executable, d.log); err != nil {
		d.log.Warn("cleaning up after earlier fence run processes", "err", err)
	}
	return nil
}

// watchHosts follows the host's addresses as interfaces change, not only
// read once: an address gained later is never reachable either.
func (d *node) watchHosts(ctx context.Context) error {
	hosts, err := hostaddr.Watch(ctx)
	if err != nil {
		return fmt.Errorf("watching the host's addresses: %w", err)
	}
	d.closers.push(func() { hosts.Close() })
	d.hosts = hosts
	d.reg = metrics.New()
	d.netShared = egress.NewShared(egress.SharedOptions{})
	d.hostAddrs = hosts.Addrs() // never reachable from a sandbox
	registerNetMetrics(d.reg, d.netShared)
	d.reg.CounterFunc("fence_audit_suppressed_total", "Sandbox-driven audit events over their sandbox's allowance, counted in audit.suppressed records instead of stored one by one.", d.auditLog.Suppressed)
	d.reg.CounterFunc("fence_audit_dropped_total", "Audit events dropped because the queue stayed full (each counted in an audit.dropped record).", d.auditLog.Dropped)
	return nil
}

// openStore opens the database and what lives in it: the secret store and
// the download log (the egress gateway reads secrets from one and records
// downloads in the other).
func (d *node) openStore(ctx context.Context) error {
	st, err := store.OpenWith(ctx, store.Options{Path: filepath.Join(d.opts.DataDir, "fence.db"), DatabaseURL: d.opts.Database})
	if err != nil {
		return fmt.Errorf("opening store: %w", err)
	}
	d.closers.push(func() { st.Close() })
	d.st = st
	if d.secrets, err = secrets.Open(secrets.Options{DB: st, NoCreate: d.opts.Database != "", TeamMax: d.teamSecrets,
		KeyPath: cmp.Or(d.opts.SecretsKey, filepath.Join(d.opts.DataDir, "secrets.key"))}); err != nil {
		return fmt.Errorf("opening secret store: %w", err)
	}
	if d.downloads, err = downloads.Open(ctx, st, downloads.Options{}); err != nil {
		return fmt.Errorf("opening download log: %w", err)
	}
	d.flows = newFlowRecorder(d.log, d.reg, d.sources.sink)
	return nil
}

// openVolumes opens the volumes under DATA-DIR/volumes, mounting each
// again if its mount went and removing what a cut-short create or delete
// left. A host that cannot make them (no loop devices, no mkfs.ext4)
// serves no volumes: their routes answer 403.
func (d *node) openVolumes(ctx context.Context) error {
	vs, err := volume.Open(ctx, volume.Options{Dir: filepath.Join(d.opts.DataDir, "volumes"), Store: d.st, Logger: d.log})
	if errors.Is(err, quota.ErrUnsupported) {
		d.log.WarnContext(ctx, "volumes are not available on this host", "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening volumes: %w", err)
	}
	d.closers.push(func() { vs.Close() })
	d.volumes = vs
	return nil
}

// openForensics opens the archive of killed sandboxes' layers, unless
// none are kept.
func (d *node) openForensics(ctx context.Context) error {
	if d.opts.ForensicsRetention < 0 {
		return nil
	}
	a, err := forensics.OpenArchive(filepath.Join(d.opts.DataDir, "forensics"),
		cmp.Or(d.opts.ForensicsRetention, forensics.DefaultRetention), d.opts.ForensicsBudget)
	if err != nil {
		return err
	}
	d.archive = a
	go a.PruneEvery(ctx, 10*time.Minute)
	return nil
}

// startGateway makes the egress gateway: its CA lives in the data dir (key
// 0600, never in a sandbox); every sandbox trusts the CA's certificate.
func (d *node) startGateway(ctx context.Context) error {
	rec := newGatewayRecorder(d.flows, d.log, d.reg, d.downloads)
	rec.audit = d.sources.sink
	d.closers.push(rec.close)
	var err error
	d.gw, d.caPEM, err = newGateway(d.opts, d.secrets, rec, d.log)
	return err
}

// startBackends starts the isolation backends (native, and gvisor where
// it can run) and the stack over them: cluster tags, warm pools.
func (d *node) startBackends(ctx context.Context) error {
	o := d.opts
	layerFS := ""
	if o.LayerFS == "btrfs" {
		layerFS = filepath.Join(o.DataDir, "native", "layerfs")
		if err := btrfs.MountImage(ctx, filepath.Join(o.DataDir, "layerfs.img"), layerFS, o.LayerFSSize); err != nil {
			return fmt.Errorf("preparing the btrfs layer store: %w", err)
		}
	}
	backend, err := native.New(ctx, native.Options{
		LayerFS:    layerFS,
		CopyLayers: o.LayerFS == "copy",
		TrustedCA:  d.caPEM,
		StateDir:   filepath.Join(o.DataDir, "native"),
		FenceDirs:  []string{o.DataDir, o.TemplatesDir},
		Executable: o.Executable,
		DiskPool:   4,
		ReadyInits: readyInits,
		Forensics:  d.archive,
		Defaults:   o.Defaults.Limits(),
		Logger:     d.log,
	})
	if err != nil {
		return fmt.Errorf("starting native backend: %w", err)
	}
	d.closers.push(func() { backend.Close() })
	d.native = backend
	routed, closeBackends, err := withGvisor(ctx, o, backend, d.caPEM, d.log)
	if err != nil {
		return err
	}
	d.closers.push(closeBackends)
	d.routed = routed
	layers := isolation.Layers(backend)
	if r, ok := routed.(*multi.Backend); ok {
		layers = r.Layers() // native's and gvisor's, each layer to its own
	}
	d.pool, d.tmplPools, d.layers = backendStack(routed, layers, o, d.log)
	d.closers.push(func() {
		for _, p := range d.allPools() {
			p.Close(context.WithoutCancel(ctx))
		}
	})
	return nil
}

func (d *node) allPools() []*warm.Pool { return append([]*warm.Pool{d.pool}, d.tmplPools...) }

// openBuilds opens the template builds: their trees and uploads live in
// the data dir; the images they start from come from the shared layer
// cache.
func (d *node) openBuilds(ctx context.Context) error {
	o := d.opts
	var images tbuild.Images
	if c, err := oci.NewCache(filepath.Join(o.DataDir, "oci")); err == nil {
		images = c
	} else {
		d.log.Info("building templates from images is not available", "err", err)
	}
	var pipIndex *tbuild.PipIndex
	if o.PipIndexURL != "" {
		var err error
		if pipIndex, err = tbuild.ParsePipIndex(o.PipIndexURL); err != nil {
			return err
		}
	}
	bo := tbuild.Options{Dir: filepath.Join(o.DataDir, "builds"), Store: d.st,
		Parents: d.templates, Images: images, Logger: d.log,
		Allow: append(slices.Clone(tbuild.DefaultAllow), o.BuildAllow...), PipIndex: pipIndex}
	if r := o.Registry; r != nil {
		reg, err := contentreg.New(contentreg.Options{URL: r.URL, CAFile: r.CAFile, Username: r.Username, Password: r.Password, Logger: d.log})
		if err != nil {
			return fmt.Errorf("content registry: %w", err)
		}
		bo.Registry, bo.Shared, bo.Node = reg, d.st, d.nodeName()
	}
	builds, err := tbuild.New(ctx, bo)
	if err != nil {
		return fmt.Errorf("opening template builds: %w", err)
	}
	d.closers.push(func() { builds.Close() })
	d.builds = builds
	return nil
}

// startSandboxes makes the sandboxes' network side (their fences and
// egress gateway configurations), then makes and starts the sandbox
// manager over it, and binds the parts made before it to it. Its
// teardown kills every sandbox (also after a failed start).
func (d *node) startSandboxes(ctx context.Context) error {
	o := d.opts
	gate, err := capacity.New(capacity.Options{Source: capacitySource(o, d.native)})
	if err != nil {
		return err
	}
	d.gate = gate
	registerCapacityMetrics(d.reg, gate)
	d.approvals = newApprovals(o, d.sources.sink, d.reg, func() *fences.Set { return d.nets })
	d.nets = fences.New(fences.Options{
		Approvals:              d.approvals,
		Fence:                  fenceConfig(o, d.flows, d.netShared, d.hostAddrs, d.log),
		Gateway:                d.gw,
		AllowInternetByDefault: o.AllowInternet,
		InspectByDefault:       o.Inspect,
		Secrets:                d.secrets,
		HostAddrs:              d.hostAddrs,
		Hosts:                  d.hosts,
		NeverCIDRs:             o.DenyCIDRs,
		Budget:                 d.quotas,
		TeamNames:              d.st,
		Logger:                 d.log,
	})
	templates := templateSet{d.builds.Catalog()}
	// The keeper of layers (snapshots, forks, checkpoints, rewinds,
	// diffs) serves the manager and is served by it: sandbox.New binds
	// it to the manager it makes; it starts once the manager has.
	snapshots, err := d.snapshotStore(templates)
	if err != nil {
		return err
	}
	keeper := timetravel.New(timetravel.Options{Store: snapshots, Templates: templates, Sealer: d.secrets, Quota: d.quotas,
		Audit: d.sources.sink, Logger: d.log})
	d.idle = idle.New(idle.Options{Logger: d.log})
	mgr, err := sandbox.New(sandbox.Options{
		Idle:         d.idle,
		MaxTimeout:   o.MaxLifetime, // the same scale: 0 is 24h, negative no cap
		Capacity:     gate,
		Backend:      d.pool,
		Store:        d.st,
		Templates:    templates,
		Defaults:     o.Defaults,
		MaxSandboxes: o.MaxSandboxes,
		Quota:        d.admission,
		Logger:       d.log,

		Network: d.nets,
		Audit:   d.sources.sink,
		Sealer:  d.secrets,
		CAEnv:   native.CAEnv(),
		Layers:  d.layers,
		Agent:   connectAgent,
		Keeper:  keeper,
	})
	if err != nil {
		return fmt.Errorf("creating sandbox manager: %w", err)
	}
	d.mgr = mgr
	d.keeper = keeper
	// The builds resolve templates for the manager; their runner, made
	// after it, runs their steps in its sandboxes and collects the layers
	// no live sandbox uses.
	d.runner = tbuild.NewRunner(ctx, d.builds, buildSandboxes{m: mgr, q: d.quotas})
	registerUsageMetrics(d.reg, mgr)
	d.reg.GaugeFunc("fence_sandboxes_running", "Sandboxes running.", func() int64 { n, _ := mgr.Counts(); return int64(n) })
	d.reg.GaugeFunc("fence_sandboxes_paused", "Sandboxes paused (they hold their memory).", func() int64 { _, n := mgr.Counts(); return int64(n) })
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("starting sandbox manager: %w", err)
	}
	d.closers.push(func() { d.stopSandboxes(ctx) }) // idempotent; covers the early returns
	if err := keeper.Start(ctx); err != nil {
		return fmt.Errorf("starting sandbox manager: %w", err)
	}
	return nil
}

// stopSandboxes ends the builds (canceled, not by their sandboxes' kill),
// then kills the warm pools' and every other sandbox. It is idempotent.
func (d *node) stopSandboxes(ctx context.Context) {
	d.builds.Close()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, p := range d.allPools() {
		if err := p.Close(sctx); err != nil {
			d.log.Error("shutting down the warm pool", "err", err)
		}
	}
	if err := d.mgr.Shutdown(sctx); err != nil {
		d.log.Error("shutting down sandboxes", "err", err)
	}
	d.keeper.Close()
}

// startWarmPools starts the warm pools: the default template's, with the
// default limits, and the --warm-template ones. Every pooled sandbox
// counts against --max-sandboxes.
func (d *node) startWarmPools(ctx context.Context) error {
	for _, name := range []string{"base", "minimal"} {
		if rootfs, err := d.templates.Resolve(name); err == nil {
			d.pool.Start(warm.Target{RootFS: rootfs, Limits: d.mgr.Defaults().Limits(), Network: d.nets.Pool()}, d.mgr.PoolBudget())
			break
		}
	}
	d.reg.GaugeFunc("fence_sandboxes_warm_ready", "Sandboxes started ahead of requests, ready to hand out (the default template's and --warm-template's).", func() int64 {
		n := d.pool.Ready()
		for _, p := range d.tmplPools {
			n += p.Ready()
		}
		return int64(n)
	})
	for i, wt := range d.opts.WarmTemplates {
		t, err := d.mgr.WarmTarget(wt.Name)
		if err != nil && wt.IfBuilt {
			d.log.Info("no warm pool of a template not built", "template", wt.Name, "err", err)
			continue
		}
		if err != nil {
			return fmt.Errorf("--warm-template %s: %w", wt.Name, err)
		}
		d.tmplPools[i].Start(t, d.mgr.PoolBudget())
	}
	return nil
}

// serve listens, joins the cluster if configured, serves the API until ctx
// is done, then shuts down: the cluster drain first (routers stop placing
// here), then the sandboxes (which aborts the streams to them, so the
// server's drain that follows is short), then the server.
func (d *node) serve(ctx context.Context) error {
	o := d.opts
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.Addr, err)
	}
	srv, err := d.newServer()
	if err != nil {
		ln.Close()
		return err
	}
	scheme := httpserve.Scheme(srv)
	var lease *cluster.Registrar
	if o.Cluster != nil {
		url, err := o.Cluster.advertised(scheme, ln.Addr())
		if err != nil {
			ln.Close()
			return err
		}
		regCtx, stopReg := context.WithCancel(ctx)
		d.closers.push(stopReg)
		if lease, err = joinCluster(regCtx, o.Cluster, url, d.mgr, o.MaxSandboxes, d.templates, d.log); err != nil {
			ln.Close()
			return err
		}
		fmt.Fprintf(d.out, "fence: node %s (tag %s) joined the cluster in namespace %s as %s\n",
			o.Cluster.Name, cluster.Tag(o.Cluster.Name), o.Cluster.Namespace, url)
		d.watchDrain(regCtx, lease)
	}
	fmt.Fprintf(d.out, "fence: serving the E2B API on %s://%s (data in %s)\n", scheme, ln.Addr(), o.DataDir)
	if o.Ready != nil {
		o.Ready(ln.Addr())
	}
	sctx, stopSSH := context.WithCancel(ctx)
	waitSSH, err := d.startSSH(sctx)
	if err != nil {
		stopSSH()
		ln.Close()
		return err
	}
	defer waitSSH()
	defer stopSSH()
	if err := httpserve.Serve(ctx, srv, ln); err != nil {
		return err
	}
	fmt.Fprintln(d.out, "fence: shutting down")
	if lease != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := lease.Drain(dctx); err != nil {
			d.log.Warn("publishing the node's drain", "err", err)
		}
		cancel()
		d.closers.push(func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := lease.Release(rctx); err != nil {
				d.log.Warn("releasing the node's lease", "err", err)
			}
		})
	}
	d.stopSandboxes(ctx)
	_ = httpserve.Shutdown(ctx, srv, 10*time.Second) // then closes what is left
	return nil
}

// newServer is the API server: the E2B API behind the cluster token when
// the daemon is a node, with the configured bounds on clients' waits.
func (d *node) newServer() (*http.Server, error) {
	o := d.opts
	timeouts := o.HTTP.withDefaults()
	var api http.Handler
	mcpHandler, stopMCP := mcp.DaemonHandler(func() http.Handler { return api })
	d.closers.push(stopMCP)
	api = httpapi.New(httpapi.Options{
		Manager:         d.mgr,
		Pauses:          d.pauser(),
		Moves:           d.locator(),
		Activity:        d.idle,
		TeamSandboxes:   sandbox.TeamsOf(d.mgr),
		Network:         d.nets,
		Layers:          d.keeper,
		APIKey:          d.key,
		Identity:        d.st,
		Domain:          o.Domain,
		Logger:          d.log,
		Metrics:         d.reg.Handler(),
		BodyIdleTimeout: timeouts.BodyIdle,
		Secrets:         d.secrets,
		Downloads:       d.downloads,
		Audit:           d.sources.log,
		Outputs:         d.sources.outputs,
		Templates:       d.runner,
		Usage:           d.mgr.Meter(),
		Quotas:          d.quotas,
		Teams:           d.st,
		Exporter: export.New(export.Options{Live: d.mgr, Usage: d.mgr.Meter(), Audit: d.sources.sink,
			Archive: layerArchive(d.archive), Backend: d.pool.Name()}),
		MCP:          mcpHandler,
		SSHKeys:      d.st,
		Approvals:    d.approvals,
		UI:           dashboard(o.NoUI),
		UISessionTTL: o.UISessionTTL,
		AuditVerify:  verifyAudit(o.DataDir),
		Volumes:      d.volumes,
		UploadTag:    uploadTag(o.Cluster),
	})
	handler := api
	if o.Cluster != nil {
		handler = cluster.RequireToken(o.Cluster.Token, handler)
	}
	return httpserve.New(httpserve.Options{
		Handler:       handler,
		Logger:        d.log,
		HeaderTimeout: timeouts.Header,
		IdleTimeout:   timeouts.Idle,
		TLSCert:       o.TLSCert,
		TLSKey:        o.TLSKey,
	})
}

// uploadTag is the node's tag in a cluster, which starts its upload
// links' tokens; empty on a node alone.
func uploadTag(c *ClusterOptions) string {
	if c == nil {
		return ""
	}
	return cluster.Tag(c.Name)
}

// dashboard is the web dashboard's handler, nil when it is off.
func dashboard(off bool) http.Handler {
	if off {
		return nil
	}
	return ui.Handler()
}

// verifyAudit checks the audit trail of dataDir with its public key, as
// `fence audit verify` does.
func verifyAudit(dataDir string) httpapi.AuditVerifier {
	return func(context.Context) (audit.Report, error) {
		key, err := audit.LoadPublicKey(filepath.Join(dataDir, audit.PubFile))
		if err != nil {
			return audit.Report{}, fmt.Errorf("reading the audit public key: %w", err)
		}
		return audit.Verify(dataDir, key)
	}
}
