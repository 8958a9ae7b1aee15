package gvisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/cgroup"
	"github.com/fencesandbox/fence/internal/insandbox/embedded"
	"github.com/fencesandbox/fence/internal/isolation"
)

// DefaultRunsc is where scripts/build-runsc.sh caches runsc.
const DefaultRunsc = "/var/lib/fence/cache/runsc/runsc"

// RunscEnv names a runsc binary to use instead of DefaultRunsc.
const RunscEnv = "FENCE_RUNSC"

// Defaults for a sandbox whose Spec leaves a limit at zero: the same as
// every backend's.
var Defaults = isolation.DefaultLimits

// Options configures a Backend.
type Options struct {
	// StateDir holds the backend's host state: runsc's state, the
	// sandboxes' bundles, overlay files and checkpoint images. Required.
	StateDir string
	// Instance separates this backend's sandboxes (cgroups, runsc root)
	// from other fence processes' on the host. Empty means "gvisor-" and a
	// hash of StateDir.
	Instance string
	// Runsc is the runsc binary. Empty means $FENCE_RUNSC, else
	// DefaultRunsc.
	Runsc string
	// Platform is runsc's platform; empty means systrap.
	Platform string
	// Executable is the static fence binary run as the agent. Empty means
	// the running executable.
	Executable string
	// Defaults replaces zero limits of a Spec; its zero fields take the
	// package's Defaults.
	Defaults isolation.Limits
	// Network is the fence of a sandbox whose Spec names none: one-off
	// sandboxes (`fence run`, benchmarks, tests). Nil makes such a create
	// fail. The daemon leaves it nil: its network side gives every
	// sandbox its own (Spec.Network).
	Network isolation.Network
	// TrustedCA is a PEM certificate every sandbox trusts on top of its
	// template's roots (the egress gateway's CA).
	TrustedCA []byte
	// LayerBytes bounds the disk the backend's layers (checkpoint images
	// of snapshots, forks and checkpoints) take together; a checkpoint past
	// it fails with isolation.ErrLayerBudget. Zero means DefaultLayerBytes.
	LayerBytes int64
	// Ephemeral makes Close remove the instance itself (for `fence run`).
	Ephemeral bool
	// Logger; nil discards.
	Logger *slog.Logger
}

// Backend is the gVisor isolation.Backend.
type Backend struct {
	opts  Options
	log   *slog.Logger
	cg    *cgroup.Manager
	runsc string
	exe   string // the agent binary (see package insandbox), a copy kept by content
	root  string // runsc --root
	sbDir string // sandbox directories
	lyDir string // layers: checkpoint images of snapshots, forks, checkpoints

	closeOnce sync.Once

	mu sync.Mutex
	// +checklocks:mu
	live map[string]*sandbox
	// +checklocks:mu
	making map[string]bool // layers being made, by ID
}

var _ isolation.Backend = (*Backend)(nil)

var idPattern = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

// New prepares the backend: its state directories, cgroup parent and the
// agent binary. It fails if runsc is missing.
func New(ctx context.Context, opts Options) (*Backend, error) {
	st, err := isolation.Setup{StateDir: opts.StateDir, Instance: opts.Instance, Logger: opts.Logger, Executable: opts.Executable}.Resolve("gvisor", InstanceOf)
	if err != nil {
		return nil, err
	}
	abs, log, exe := st.StateDir, st.Logger, st.Executable
	opts.StateDir, opts.Instance = abs, st.Instance
	if opts.Platform == "" {
		opts.Platform = "systrap"
	}
	opts.Defaults = withDefaults(opts.Defaults, Defaults)
	runsc, err := FindRunsc(opts.Runsc)
	if err != nil {
		return nil, err
	}
	b := &Backend{
		opts:  opts,
		log:   log,
		runsc: runsc,
		root:  filepath.Join(abs, "runsc", opts.Instance),
		sbDir: filepath.Join(abs, "sandboxes", opts.Instance),
		lyDir: filepath.Join(abs, "layers", opts.Instance),
		live:  map[string]*sandbox{},

		making: map[string]bool{},
	}
	for _, d := range []string{abs, b.root, b.sbDir, b.lyDir, filepath.Join(abs, "bin")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating state directory: %w", err)
		}
	}
	// Sandboxes run the in-sandbox binary the fence binary carries, or
	// the fence binary itself when it carries none.
	in, err := embedded.Resolve(ctx, exe, filepath.Join(abs, "bin"))
	if err != nil {
		return nil, err
	}
	if b.exe, err = keepBinary(in, filepath.Join(abs, "bin")); err != nil {
		return nil, err
	}
	if b.cg, err = cgroup.NewManager("fence/" + opts.Instance); err != nil {
		return nil, fmt.Errorf("preparing cgroups: %w", err)
	}
	return b, nil
}

// InstanceOf is the instance of a backend on stateDir (absolute) whose
// Options leave Instance empty: "gvisor-" and the first 8 hex digits of
// the SHA-256 of stateDir.
func InstanceOf(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return "gvisor-" + hex.EncodeToString(sum[:4])
}

// instancePattern matches the instances InstanceOf names.
var instancePattern = regexp.MustCompile(`^gvisor-[0-9a-f]{8}$`)

// CleanupStale removes the sandboxes, cgroups and runsc mounts of the
// daemon instances under opts.StateDir other than the one New(opts)
// makes: an earlier daemon on the same data dir made them under another
// spelling of its path (a symlink, before the daemon resolved its data
// dir). Their sandboxes cannot be adopted by this instance; their layers
// stay on disk. The caller holds the data dir's lock, so no other daemon
// runs on it; opts.Instance must be empty.
func CleanupStale(ctx context.Context, opts Options) error {
	if opts.Instance != "" {
		return errors.New("gvisor backend: CleanupStale is for the default instance")
	}
	abs, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return fmt.Errorf("resolving state directory: %w", err)
	}
	ents, err := os.ReadDir(filepath.Join(abs, "runsc"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	own := InstanceOf(abs)
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if name == own || !instancePattern.MatchString(name) {
			continue
		}
		if opts.Logger != nil {
			opts.Logger.InfoContext(ctx, "removing what an earlier daemon on this data dir left under another instance", "instance", name)
		}
		o := opts
		o.Instance = name
		b, err := New(ctx, o)
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

// FindRunsc returns the runsc binary to use: path, else $FENCE_RUNSC, else
// DefaultRunsc. A missing binary is an error that says how to build it.
func FindRunsc(path string) (string, error) {
	if path == "" {
		path = os.Getenv(RunscEnv)
	}
	if path == "" {
		path = DefaultRunsc
	}
	st, err := os.Stat(path)
	if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("runsc not found at %s (build it with scripts/build-runsc.sh, or set %s): %w", path, RunscEnv, ErrNoRunsc)
	}
	return path, nil
}

// ErrNoRunsc is returned by New and FindRunsc when runsc is missing.
var ErrNoRunsc = errors.New("no runsc")

// keepBinary copies the agent's binary into dir under a name derived from
// its content and returns the copy's path. A checkpointed sandbox holds
// its agent's binary open: restoring it needs the very same file, also
// after the daemon's own binary has been replaced.
func keepBinary(exe, dir string) (string, error) {
	f, err := os.Open(exe)
	if err != nil {
		return "", fmt.Errorf("opening the agent's binary: %w", err)
	}
	defer f.Close()
	return embedded.Keep(dir, "fence-", f)
}

// Name implements isolation.Backend.
func (b *Backend) Name() string { return "gvisor" }

// Close releases the backend's own resources; an Ephemeral backend also
// removes its instance. Sandboxes must have been killed first.
func (b *Backend) Close() error {
	var err error
	b.closeOnce.Do(func() {
		// runsc pins an empty network namespace for its gofers by a bind
		// mount in its root, made again when missing: it must not outlive
		// the backend (concurrent runsc commands may have stacked several).
		for unix.Unmount(filepath.Join(b.root, "null-netns"), unix.MNT_DETACH) == nil {
		}
		// The cgroup parent goes once empty, in fence's hierarchies and in
		// those runsc added groups to (cpuset, devices, blkio on v1); one
		// still in use (a paused sandbox kept on disk) stays.
		_ = b.cg.RemoveParent()
		if dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "fence", b.opts.Instance)); dirs != nil {
			for _, d := range dirs {
				_ = unix.Rmdir(d)
			}
		}
		if !b.opts.Ephemeral {
			return
		}
		var errs []error
		for _, d := range []string{b.root, b.sbDir, b.lyDir} {
			if e := os.RemoveAll(d); e != nil {
				errs = append(errs, e)
			}
		}
		err = errors.Join(errs...)
	})
	return err
}

func withDefaults(l, d isolation.Limits) isolation.Limits { return l.WithDefaults(d) }

// runscTimeout bounds one runsc command.
const runscTimeout = 2 * time.Minute

// run runs runsc with the backend's global flags and args, and returns its
// error with what it printed.
func (b *Backend) run(ctx context.Context, extra []string, args ...string) error {
	return b.runOut(ctx, nil, extra, args...)
}

// runOut is run with runsc's stdout and stderr going to out when it is
// not nil. A command that starts a sandbox (run, restore) must write to a
// file, never a pipe: the detached sandbox keeps its stdio, and a pipe
// would hold the command's Wait until the sandbox ends.
func (b *Backend) runOut(ctx context.Context, out *os.File, extra []string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, runscTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.runsc, append(append(b.globalFlags(), extra...), args...)...)
	var buf bytes.Buffer
	if out != nil {
		cmd.Stdout, cmd.Stderr = out, out
	} else {
		cmd.Stdout, cmd.Stderr = &buf, &buf
	}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		msg := buf.Bytes()
		if out != nil {
			msg = tail(out.Name(), 2048)
		}
		return fmt.Errorf("runsc %s: %w: %s", args[0], err, bytes.TrimSpace(msg))
	}
	return nil
}

// tail returns the last n bytes of the file at path.
func tail(path string, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(st.Size()-n, 0)
	buf := make([]byte, st.Size()-off)
	k, _ := f.ReadAt(buf, off)
	return buf[:k]
}

func (b *Backend) globalFlags() []string {
	return []string{"--root", b.root, "--platform", b.opts.Platform, "--network", "sandbox"}
}

// Cleanup implements isolation.Backend: it deletes every container,
// cgroup and sandbox directory of this instance that is not live (or
// adopted) in this process, then the layers a crash left half-made.
func (b *Backend) Cleanup(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	ids, err := b.cg.List()
	if err != nil {
		return nil, fmt.Errorf("listing cgroups: %w", err)
	}
	for _, id := range ids {
		seen[id] = true
	}
	for _, dir := range []string{b.sbDir, b.root} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			name := strings.TrimSuffix(e.Name(), ".state")
			if i := strings.IndexByte(name, '_'); i > 0 {
				name = name[:i] // runsc's own files: <id>_sandbox:<id>.state
			}
			seen[name] = true
		}
	}
	var removed []string
	var errs []error
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
	// After the sandboxes: a checkpoint a crash cut short ends with its
	// sandbox, and cannot write into its layer after this.
	errs = append(errs, b.removePartialLayers())
	return removed, errors.Join(errs...)
}

// removeLeftovers deletes the container, cgroup and directory of id.
func (b *Backend) removeLeftovers(ctx context.Context, id string) error {
	var errs []error
	if err := b.run(ctx, nil, "delete", "--force", id); err != nil && !strings.Contains(err.Error(), "does not exist") &&
		!strings.Contains(err.Error(), "not found") {
		errs = append(errs, err)
	}
	if g, err := b.cg.Open(id); err == nil {
		if err := g.Remove(ctx); err != nil {
			errs = append(errs, fmt.Errorf("removing cgroup: %w", err))
		}
	}
	if err := os.RemoveAll(filepath.Join(b.sbDir, id)); err != nil {
		errs = append(errs, fmt.Errorf("removing state: %w", err))
	}
	return errors.Join(errs...)
}
