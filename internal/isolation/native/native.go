package native

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fencesandbox/fence/internal/forensics"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/btrfs"
	"github.com/fencesandbox/fence/internal/cgroup"
	"github.com/fencesandbox/fence/internal/insandbox/embedded"
	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/quota"
	"github.com/fencesandbox/fence/internal/seccomp"
)

// Defaults for a sandbox whose Spec leaves a limit at zero.
var Defaults = isolation.DefaultLimits

// Options configures a Backend.
type Options struct {
	// StateDir holds the backend's host-side state (sockets, slots, the
	// writable layers). Required.
	StateDir string
	// Instance names this backend's cgroup parent (fence/<Instance>) and
	// separates its sandboxes from those of other fence processes on the
	// host: it must be unique on the host. Empty means InstanceOf(StateDir)
	// ("serve-" and a hash of its path), so daemons on different data dirs
	// never touch each other's sandboxes. The daemon passes StateDir with
	// its symlinks resolved, so that every spelling of one data dir is the
	// same instance.
	Instance string
	// SlotsDir holds the uid-range slot locks. It must be the same for
	// every fence process on the host, so that no two sandboxes share host
	// uids. Empty means /run/fence/slots.
	SlotsDir string
	// Defaults replaces zero limits of a Spec. Zero fields of Defaults take
	// the package's Defaults.
	Defaults isolation.Limits
	// DiskPool is how many writable layers of the default disk size the
	// backend keeps formatted and mounted ahead of Create. Zero means none
	// (right for one-off sandboxes such as `fence run`).
	DiskPool int
	// ReadyInits is how many sandbox init processes the backend keeps
	// started ahead of Create (see readyinit.go): namespaces cloned and
	// runtime started, belonging to no sandbox until a create takes one,
	// so that a cold create does not wait for them. Each holds a uid slot
	// and a few MiB. Zero means none (right for one-off sandboxes).
	ReadyInits int
	// Network is the fence of a sandbox whose Spec names none: one-off
	// sandboxes (`fence run`, benchmarks, tests). Nil makes such a create
	// fail. The daemon leaves it nil: its network side gives every
	// sandbox its own (Spec.Network).
	Network isolation.Network
	// TrustedCA is a PEM certificate every sandbox trusts on top of its
	// template's roots: the egress gateway's CA. It is added to the
	// sandbox's own copy of /etc/ssl/certs/ca-certificates.crt and written
	// alone to /etc/fence/ca.pem (see CAEnv).
	TrustedCA []byte
	// Ephemeral makes Close remove the instance itself (its cgroup parent
	// and directories), for one-off instances such as `fence run`'s.
	Ephemeral bool
	// FenceDirs are fence's directories beside StateDir (its data dir and
	// templates dir) that no bind may expose: see
	// isolation.CheckBindSource, which every bind source passes here,
	// with StateDir among them.
	FenceDirs []string
	// NoSeccomp disables the seccomp filter (for debugging only).
	NoSeccomp bool
	// Executable is the fence binary whose in-sandbox binary runs as
	// `fence init`, which becomes the sandbox's agent. Empty means the running executable. It
	// must be a static binary (CGO_ENABLED=0): templates carry no libc.
	Executable string
	// Forensics, if set, keeps the writable layer of each killed sandbox
	// (archived in the background release, never on the kill's path).
	Forensics *forensics.Archive
	// LayerBudget is the disk the layers of checkpoints, snapshots and
	// forks may take in all; zero means 8 GiB.
	LayerBudget int64
	// LayerFS is a directory on a btrfs filesystem for the btrfs layer
	// store (layerfs.go): writable layers as subvolumes, checkpoints as
	// snapshots. Empty means <StateDir>/layerfs when StateDir is on btrfs,
	// else none: writable layers on per-sandbox ext4 images and
	// checkpoints as copies.
	LayerFS string
	// CopyLayers keeps the copy store even where StateDir is on btrfs.
	CopyLayers bool
	// Logger receives diagnostics, including the first bytes each sandbox's
	// init writes to stderr. Nil discards.
	Logger *slog.Logger
}

// Backend is the native isolation.Backend.
type Backend struct {
	opts  Options
	log   *slog.Logger
	inExe string // the binary sandboxes run (init, agent): see package insandbox
	// exeTouched is when inExe's mtime was last moved (markExeInUse).
	exeTouched atomic.Int64
	cg         *cgroup.Manager
	disk       *quota.FS // nil when project quotas are unavailable or lfs is used
	lfs        *layerFS  // the btrfs layer store; nil for the copy store
	slots      *slots
	exe        string
	spawner    spawner // clones sandboxes (spawn.go)
	// ready holds inits started ahead (readyinit.go); room holds one token
	// per init the filler may start: the sandbox that took an init, whose
	// kill that start may wait for (refillAfter, refillDefer). Both nil
	// without Options.ReadyInits.
	ready     chan *readyInit
	room      chan refillAfter
	readyCg   *cgroup.Group // where they wait (readyGroup)
	stopReady context.CancelFunc
	readyDone chan struct{}
	sockDir   string
	// sockDirFD is an O_PATH descriptor of sockDir, kept for the backend's
	// lifetime.
	sockDirFD int
	sbDir     string

	// bundles caches, per template root, its CA bundle with TrustedCA
	// appended.
	bundles sync.Map // string → []byte

	seccompOnce sync.Once
	seccompProg []byte // the encoded sandbox filter (see seccompFilter)
	seccompErr  error

	closeOnce sync.Once
	closing   sync.WaitGroup // killed sandboxes releasing their resources, network stacks shutting down
	squashes  sync.WaitGroup // squashes of checkpoints in progress (squash.go)
	reapers   chan struct{}  // a slot per release in progress (see sandbox.Kill)
	pending   *backlog       // killed sandboxes whose release is pending
	// releaseTimes sums the steps of the background releases.
	releaseTimes releaseTimes
	// traces holds the traced creates' steps (TraceCreates).
	traces createTraces
	// reapHook, when set (tests), runs before each background release.
	reapHook func(id string)

	layers layerCache // checkpoint.go

	mu sync.Mutex
	// +checklocks:mu
	live map[string]*sandbox
	// byID holds live's sandboxes by ID: one, or a few while killed
	// predecessors of the same ID are released (addLive, dropLive).
	// +checklocks:mu
	byID map[string][]*sandbox
}

// addLive adds s to live under its key.
//
// +checklocks:b.mu
func (b *Backend) addLive(s *sandbox) {
	b.live[s.key] = s
	b.byID[s.id] = append(b.byID[s.id], s)
}

// dropLive removes s from live.
//
// +checklocks:b.mu
func (b *Backend) dropLive(s *sandbox) {
	if b.live[s.key] == s {
		delete(b.live, s.key)
	}
	same := slices.DeleteFunc(b.byID[s.id], func(o *sandbox) bool { return o == s })
	if len(same) == 0 {
		delete(b.byID, s.id)
	} else {
		b.byID[s.id] = same
	}
}

// liveVisits counts the live sandboxes a create's check for one of the
// same ID looked at, for tests.
var liveVisits atomic.Int64

var _ isolation.Backend = (*Backend)(nil)

// idPattern matches a sandbox ID: 1 to 64 of [a-z0-9] (the length checked
// apart: a bounded repetition compiles into 64 copies of the class, at
// every start of the binary).
var idPattern = boundedRE{regexp.MustCompile(`^[a-z0-9]+$`), 64}

// boundedRE is a pattern with a maximum length.
type boundedRE struct {
	re  *regexp.Regexp
	max int
}

func (b boundedRE) MatchString(s string) bool { return len(s) <= b.max && b.re.MatchString(s) }

// New prepares the backend's state directory, cgroup parent and disk.
func New(ctx context.Context, opts Options) (*Backend, error) {
	st, err := isolation.Setup{StateDir: opts.StateDir, Instance: opts.Instance, Logger: opts.Logger, Executable: opts.Executable}.Resolve("native", InstanceOf)
	if err != nil {
		return nil, err
	}
	log, exe := st.Logger, st.Executable
	opts.StateDir, opts.Instance = st.StateDir, st.Instance
	if opts.SlotsDir == "" {
		opts.SlotsDir = "/run/fence/slots"
	}
	opts.Defaults = withDefaults(opts.Defaults, Defaults)
	if err := CheckExecutable(exe); err != nil {
		return nil, err
	}
	b := &Backend{
		opts:    opts,
		log:     log,
		exe:     exe,
		sockDir: filepath.Join(opts.StateDir, "sock", opts.Instance),
		sbDir:   filepath.Join(opts.StateDir, "sandboxes", opts.Instance),
		live:    make(map[string]*sandbox),
		byID:    make(map[string][]*sandbox),
		reapers: make(chan struct{}, reapers),
		pending: newBacklog(maxPendingReleases),
	}
	// The state directory must be traversable (not readable) by sandbox
	// uids, which own their own sandbox directory below it.
	for _, d := range []string{opts.StateDir, filepath.Join(opts.StateDir, "sandboxes"), b.sbDir, b.scratchDir()} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("creating state directory: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, fmt.Errorf("creating state directory: %w", err)
		}
	}
	if err := checkTraversable(opts.StateDir); err != nil {
		return nil, err
	}
	// Sandboxes run the in-sandbox binary the fence binary carries, or
	// the fence binary itself when it carries none.
	if b.inExe, err = embedded.Resolve(ctx, exe, filepath.Join(opts.StateDir, "bin")); err != nil {
		return nil, err
	}
	if err := CheckExecutable(b.inExe); err != nil {
		return nil, err
	}
	if b.inExe == exe {
		log.InfoContext(ctx, "this fence binary carries no in-sandbox binary: sandboxes run the fence binary, and start slower (build with scripts/build.sh)")
	}
	// The spawner runs it too: the smaller its memory, the less each clone
	// of a sandbox's init copies (see package spawnrole).
	b.spawner.exe = b.inExe
	if err := os.MkdirAll(b.sockDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating socket directory: %w", err)
	}
	// Socket paths are made short (sun_path holds 108 bytes) by naming
	// them through a descriptor of their directory.
	fd, err := unix.Open(b.sockDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening socket directory: %w", err)
	}
	b.sockDirFD = fd
	go b.spawner.warm()
	if b.slots, err = newSlots(opts.SlotsDir); err != nil {
		return nil, err
	}
	if b.cg, err = cgroup.NewManager("fence/" + opts.Instance); err != nil {
		return nil, fmt.Errorf("preparing cgroups: %w", err)
	}
	if opts.LayerFS == "" && !opts.CopyLayers {
		if ok, _ := btrfs.IsBtrfs(opts.StateDir); ok {
			opts.LayerFS = filepath.Join(opts.StateDir, "layerfs")
			b.opts.LayerFS = opts.LayerFS
		}
	}
	if opts.LayerFS != "" && !opts.CopyLayers {
		if b.lfs, err = openLayerFS(opts.LayerFS, opts.Instance); err != nil {
			return nil, err
		}
		if !b.lfs.quota {
			log.WarnContext(ctx, "btrfs simple quotas unavailable: writable layers are bounded by the layer filesystem's size alone", "layer_fs", opts.LayerFS)
		}
		if err := b.startReady(ctx); err != nil {
			return nil, err
		}
		return b, nil
	}
	diskDir := filepath.Join(opts.StateDir, "disk", opts.Instance)
	if err := os.MkdirAll(diskDir, 0o711); err != nil {
		return nil, fmt.Errorf("creating disk directory: %w", err)
	}
	b.disk, err = quota.Open(ctx, quota.Options{
		ImageDir:  filepath.Join(opts.StateDir, "images", opts.Instance),
		MountDir:  diskDir,
		Logger:    log,
		PoolSize:  opts.DiskPool,
		PoolLimit: opts.Defaults.DiskBytes,
		Dirs:      layerDirs,
	})
	if err != nil {
		if !errors.Is(err, quota.ErrUnsupported) {
			return nil, fmt.Errorf("preparing sandbox disk: %w", err)
		}
		log.WarnContext(ctx, "disk limits unavailable: writable layers are not size-limited", "err", err)
		b.disk = nil
	}
	if err := os.Chmod(diskDir, 0o711); err != nil {
		return nil, fmt.Errorf("preparing sandbox disk: %w", err)
	}
	if err := b.startReady(ctx); err != nil {
		if b.disk != nil {
			b.disk.Close()
		}
		return nil, err
	}
	return b, nil
}

// Name implements isolation.Backend.
func (b *Backend) Name() string { return "native" }

// Close releases the backend's own resources. Sandboxes must have been
// killed first; it exists so callers need not change when a backend
// acquires shared resources.
func (b *Backend) Close() error {
	var err error
	b.closeOnce.Do(func() {
		b.closing.Wait()
		b.squashes.Wait()
		// The spawner first: it may live in the ready inits' cgroup,
		// whose removal would kill it.
		b.spawner.close()
		b.stopReadyInits()
		unix.Close(b.sockDirFD)
		if b.opts.Ephemeral {
			err = b.removeInstance()
			return
		}
		if b.disk != nil {
			b.disk.Close()
		}
		// The instance's cgroup parent goes too once empty; a sandbox
		// still in it (the caller did not kill it) keeps it.
		_ = b.cg.RemoveParent()
	})
	return err
}

// InstanceOf is the instance of a backend on stateDir whose Options leave
// Instance empty: "serve-" and the first 8 hex digits of the SHA-256 of
// stateDir, an absolute path.
func InstanceOf(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return "serve-" + hex.EncodeToString(sum[:4])
}

// servePattern matches the instances InstanceOf names.
var servePattern = regexp.MustCompile(`^serve-[0-9a-f]{8}$`)

// CleanupStale removes the instances under stateDir (absolute) that no
// process runs any more: the one-off instances (`fence run`, `fence
// bench`) whose process is gone, and every daemon instance other than
// InstanceOf(stateDir), which an earlier daemon on the same data dir
// made under another spelling of its path (before the daemon resolved
// its data dir's symlinks); their sandboxes, cgroups, mounts and
// directories. A daemon calls it on start, holding its data dir's lock,
// so no other daemon can be running on stateDir. executable is as
// Options.Executable.
func CleanupStale(ctx context.Context, stateDir, executable string, log *slog.Logger) error {
	ents, err := os.ReadDir(filepath.Join(stateDir, "sandboxes"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	own := InstanceOf(stateDir)
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if servePattern.MatchString(name) {
			if name == own {
				continue
			}
			log.InfoContext(ctx, "removing what an earlier daemon on this data dir left under another instance", "instance", name)
		} else {
			_, pidText, ok := strings.Cut(name, "-")
			pid, perr := strconv.Atoi(pidText)
			if !ok || perr != nil || pid <= 0 || !(strings.HasPrefix(name, "run-") || strings.HasPrefix(name, "bench-")) {
				continue
			}
			if unix.Kill(pid, 0) == nil {
				continue // still running (or the pid was reused: leave it)
			}
		}
		b, err := New(ctx, Options{StateDir: stateDir, Instance: name, Ephemeral: true, Executable: executable, Logger: log})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := b.Cleanup(ctx); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, b.Close())
	}
	return errors.Join(errs...)
}

// removeInstance removes the instance's cgroup parent and directories,
// which must hold no sandbox any more.
func (b *Backend) removeInstance() error {
	errs := []error{b.cg.RemoveParent()}
	if b.disk != nil {
		errs = append(errs, b.disk.Destroy())
	}
	if b.lfs != nil {
		for _, d := range []string{b.lfs.sbDir, b.lfs.snapDir} {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("removing instance directory: %w", err))
			}
		}
	}
	for _, d := range []string{b.sockDir, b.sbDir} {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing instance directory: %w", err))
		}
	}
	return errors.Join(errs...)
}

// layerDirs are the directories every writable layer holds before the
// sandbox's files are written: the overlay's upper and work directories,
// and the upper's directories of the files a create writes (prepareDirs).
// The disk pool makes them when it prepares a filesystem, ahead of the
// create.
var layerDirs = []string{"upper", "work", "upper/etc", "upper/usr/bin"}

// scratchDir is where each init mounts a tmpfs of its own, in its mount
// namespace alone, for the mount points of its template, layers and root
// (nsinit.Config.Scratch). On the host it is an empty directory, shared by
// every instance of the state directory.
func (b *Backend) scratchDir() string { return filepath.Join(b.opts.StateDir, "scratch") }

// sockPath names sandbox id's agent socket, short enough for sun_path.
// It names the directory through the calling thread's table of
// descriptors (thread-self): /proc/self/fd is the table of the process's
// first thread, which is not every thread's once one of them has a table
// of its own.
func (b *Backend) sockPath(id string) string {
	return fmt.Sprintf("/proc/thread-self/fd/%d/%s.sock", b.sockDirFD, id)
}

// checkTraversable makes sure sandbox uids can reach their directories
// below dir: every ancestor must be searchable by others.
func checkTraversable(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("checking state directory: %w", err)
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("state directory %s is below %s, which sandbox users cannot traverse (mode %v): chmod o+x it or choose another data dir", dir, d, st.Mode().Perm())
		}
		if d == "/" {
			return nil
		}
	}
}

func withDefaults(l, d isolation.Limits) isolation.Limits { return l.WithDefaults(d) }

// Cleanup implements isolation.Backend. It removes every sandbox of this
// instance that is not live in this process: cgroups, sockets, writable
// layers and state directories.
func (b *Backend) Cleanup(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	ids, err := b.cg.List()
	if err != nil {
		return nil, fmt.Errorf("listing cgroups: %w", err)
	}
	for _, id := range ids {
		if id != readyGroup {
			seen[id] = true
		}
	}
	dirs := []string{b.sbDir, b.sockDir}
	if b.disk != nil {
		left, err := b.disk.Dirs()
		if err != nil {
			return nil, fmt.Errorf("listing writable layers: %w", err)
		}
		for _, id := range left {
			seen[id] = true
		}
	}
	if b.lfs != nil {
		for _, id := range b.lfs.dirs() {
			seen[id] = true
		}
	}
	for _, dir := range dirs {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			name := e.Name()
			if filepath.Ext(name) == ".sock" {
				name = name[:len(name)-len(".sock")]
			}
			seen[name] = true
		}
	}
	var removed []string
	errs := []error{b.cleanupLayers(), b.cleanupSnapshots()}
	for id := range seen {
		b.mu.Lock()
		_, live := b.live[id]
		b.mu.Unlock()
		if live || !idPattern.MatchString(id) {
			continue
		}
		if err := b.removeLeftovers(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("cleaning up sandbox %s: %w", id, err))
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

// removeLeftovers kills and removes everything named after id.
func (b *Backend) removeLeftovers(ctx context.Context, id string) error {
	var errs []error
	if g, err := b.cg.Open(id); err == nil {
		if err := g.Remove(ctx); err != nil {
			errs = append(errs, fmt.Errorf("removing cgroup: %w", err))
		}
	}
	if err := os.Remove(filepath.Join(b.sockDir, id+".sock")); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if b.disk != nil {
		if err := b.disk.RemoveDir(id); err != nil {
			errs = append(errs, fmt.Errorf("removing writable layer: %w", err))
		}
	}
	if b.lfs != nil {
		if err := b.lfs.removeDir(id); err != nil {
			errs = append(errs, fmt.Errorf("removing writable layer: %w", err))
		}
	}
	if err := os.RemoveAll(filepath.Join(b.sbDir, id)); err != nil {
		errs = append(errs, fmt.Errorf("removing state: %w", err))
	}
	return errors.Join(errs...)
}

// seccompFilter returns the sandboxes' seccomp filter, compiled once per
// backend (compiling costs milliseconds and megabytes, every init would
// pay them) and encoded for the init config.
func (b *Backend) seccompFilter() ([]byte, error) {
	b.seccompOnce.Do(func() {
		prog, err := seccomp.Program()
		if err != nil {
			b.seccompErr = fmt.Errorf("compiling seccomp filter: %w", err)
			return
		}
		b.seccompProg = nsinit.EncodeFilter(prog)
	})
	return b.seccompProg, b.seccompErr
}

// GroupTasks reads the tasks of this backend's sandboxes (its cgroup
// parent's pids.current) and the pids.max an operator set on that parent,
// ok false when none is set.
func (b *Backend) GroupTasks() (used, max int64, ok bool) { return b.cg.ParentPids() }
