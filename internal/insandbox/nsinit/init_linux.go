// Package nsinit is the sandbox's first process on the native backend (the
// `fence init` role): cloned by the daemon's spawner into the sandbox's new
// namespaces, builds the sandbox's /proc, /sys and /dev while it waits,
// receives its Config and the detached mounts of the template, binds and
// layers over the sync socket, builds the sandbox's root (overlay, then
// /proc, /sys, /dev and the agent binary attached), waits for the
// daemon's go-ahead, drops privileges (capability sets, no_new_privs,
// seccomp) on every thread and becomes the agent, without an exec: its Go
// runtime and packages are started long before its sandbox exists (an
// init started ahead), so a sandbox's first command does not wait for a
// second program to start.
//
// It is kept small on purpose: it runs in the in-sandbox binary
// (cmd/fence-sandbox) as well as in the fence binary, and every start of
// a sandbox pays for the packages it links.
//
// # Guarantees
//
//   - Nothing of the sandbox runs before the daemon's go-ahead, which it
//     sends once the process is in the sandbox's cgroups.
//   - When Init returns without error, every thread of the process has the
//     bounded capabilities, no_new_privs, the seccomp filter and the cgroup
//     namespace every process of the sandbox inherits, and the process
//     holds no descriptor but its standard streams, the agent's listener
//     and lifeline (and the Go runtime's own poller).
//   - On failure, the error is written to the sync socket and Init returns
//     it; the daemon tears the sandbox down. The daemon counts the sandbox
//     started only once the agent says it serves (Serving): an init or
//     agent that dies before, e.g. for want of a thread under a small pids
//     limit, fails the create.
package nsinit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/agent/boot"
	"github.com/fencesandbox/fence/internal/sysmon"
)

// File descriptors `fence init` receives from the daemon; the agent's
// are those of its boot contract (package boot).
const (
	// SyncFD is the init's end of a SOCK_SEQPACKET pair: it receives the
	// Config (with the mounts' descriptors), then the go-ahead, and
	// answers with an error message, or Serving once the process serves
	// as the agent. EOF alone means the process died on the way.
	SyncFD     = 3
	listenerFD = boot.ListenerFD
	lifelineFD = boot.LifelineFD
)

// GoAhead is the byte the daemon sends once the sandbox is in its cgroups.
const GoAhead = 'g'

// Started is the byte the init sends once it serves as the agent
// (Serving).
const Started = 's'

// agentPath is where the in-sandbox binary is bind-mounted.
const agentPath = boot.Path

// Config is what the daemon sends to `fence init` in the new namespaces.
type Config struct {
	ID string `json:"id"`
	// Scratch, when set, is a directory the init mounts a tmpfs of its
	// own on (in its mount namespace alone), where it makes LowerDir,
	// RootDir and LayerDirs, which must then be its direct children.
	// Without it they are directories the daemon made.
	Scratch  string `json:"scratch,omitempty"`
	LowerDir string `json:"lowerDir"` // where to attach the idmapped template
	RootDir  string `json:"rootDir"`  // overlay mount point
	UpperDir string `json:"upperDir"`
	WorkDir  string `json:"workDir"`
	// DiskDir, when set, is where to attach the writable layer (the btrfs
	// store's subvolume, idmapped, or the limited disk's mount): its
	// descriptor travels after the layers'.
	DiskDir string `json:"diskDir,omitempty"`
	// Listener is set when the agent's listening socket travels last,
	// for ListenerFD.
	Listener bool `json:"listener,omitempty"`
	// Binds are attached from descriptors sent after the template's, in
	// order; only their target and kind travel here.
	Binds []BindTarget `json:"binds,omitempty"`
	// LayerDirs are where to attach the frozen layers the sandbox boots
	// on, top first; they travel after the binds' descriptors.
	LayerDirs []string `json:"layerDirs,omitempty"`
	NoFile    uint64   `json:"noFile"`
	// NoSetFCap drops CAP_SETFCAP from the sandbox's root too. A sandbox
	// with a writable bind of a directory of root's has it set: there the
	// sandbox's user stands for host root, and a file capability the
	// sandbox's root gave with the user as its root id would be host
	// root's, honoured for anyone on the host who runs the file.
	NoSetFCap bool `json:"noSetFCap,omitempty"`
	// Seccomp is the filter to install (EncodeFilter), compiled once per
	// backend; empty means none.
	Seccomp  []byte      `json:"seccomp,omitempty"`
	ShmBytes int64       `json:"shmBytes"`
	Agent    boot.Config `json:"agent"`
	// Trace asks the init to time its steps (trace_linux.go) and send the
	// times with Started; `fence bench` reads them.
	Trace bool `json:"trace,omitempty"`
	// InCgroups says the init is in the sandbox's cgroups on every
	// hierarchy already (a ready init waiting in a group of its own,
	// which its create renames to the sandbox's: the same groups), so
	// that it enters its cgroup namespace before the go-ahead, while the
	// daemon finishes the sandbox's cgroups and network, rather than
	// after it. Without it the daemon may still move the init, and the
	// namespace waits for the go-ahead.
	InCgroups bool `json:"inCgroups,omitempty"`
}

// BindTarget is where a bind goes inside the sandbox.
type BindTarget struct {
	Path  string `json:"path"`
	IsDir bool   `json:"isDir"`
}

// InitEnv is the environment an init is started with: the agent's PATH
// and a single P for the Go runtime until the init has bounded its
// capabilities (setup).
var InitEnv = []string{boot.DefaultPath, "GOMAXPROCS=1"}

// agentProcs bounds the agent's GOMAXPROCS. The Go runtime never ends an
// OS thread it has made (unless a locked goroutine exits), and each P
// can take one more when the agent is busy: with one P an idle agent
// holds four threads (sysmon, the template thread locked goroutines
// need, the thread that runs the P and one spare the runtime made while
// its start blocked the first), with two a fifth. A sandbox's CPU
// bandwidth is one core unless its create asks for more, which the agent
// shares with the sandbox's workload: a second P would buy it little.
const agentProcs = 1

var maskedFiles = []string{
	"/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
}

var maskedDirs = []string{
	"/proc/asound", "/proc/acpi", "/proc/scsi", "/sys/firmware",
	"/sys/devices/virtual/powercap",
}

var readOnlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// Init is the `fence init` role: it runs as PID 1 of a new sandbox, in its
// new namespaces, and sets up the sandbox. On success the process has
// become the sandbox's agent in all but its code: its environment is the
// agent's, its privileges on every thread are those every process of the
// sandbox has, the daemon has been told, and the caller serves the agent
// with the returned configuration on boot.ListenerFD and boot.LifelineFD.
// On failure the error has been reported to the daemon. On success the
// caller calls Serving once the agent serves.
//
// meanwhile, if not nil, is started in a goroutine once nothing it does
// can escape the sandbox's capability bounds, while the init waits for its
// sandbox: the part of the agent's start that depends on nothing of it.
func Init(meanwhile func()) (boot.Config, error) {
	sync := os.NewFile(SyncFD, "sync")
	cfg, err := setup(sync, meanwhile)
	if err != nil {
		_, _ = sync.Write([]byte(err.Error()))
		return boot.Config{}, err
	}
	runtime.UnlockOSThread()
	syncFile = sync
	return cfg.Agent, nil
}

// syncFile is the sync socket from Init's success to Serving.
var syncFile *os.File

// Serving tells the daemon that the init serves as the sandbox's agent,
// and closes the sync socket. Call it once, after Init succeeded.
func Serving() error {
	if syncFile == nil {
		return errors.New("telling the daemon the agent serves: no sync socket")
	}
	defer syncFile.Close()
	mark(MarkServing)
	if _, err := syncFile.Write(startedAnswer()); err != nil {
		return fmt.Errorf("telling the daemon the agent serves: %w", err)
	}
	return nil
}

func setup(sync *os.File, meanwhile func()) (*Config, error) {
	if err := prepare(); err != nil {
		return nil, err
	}
	// The runtime's monitor thread polls less (package sysmon). This needs
	// CAP_SYS_NICE in the init's user namespace (to set another thread's
	// timer slack) and reads /proc: it ends before the descriptors are
	// closed and the privileges dropped, given up if not done by then.
	relaxCtx, cancelRelax := context.WithCancel(context.Background())
	relaxed := make(chan struct{})
	go func() {
		defer close(relaxed)
		_ = sysmon.Relax(relaxCtx, "/proc", sysmon.Default, 0)
	}()
	stopRelax := func() { cancelRelax(); <-relaxed }
	defer stopRelax()
	if meanwhile != nil {
		go meanwhile()
	}
	kit := ahead()
	cfg, fds, err := receiveConfig(sync)
	if err != nil {
		return nil, err
	}
	traced = cfg.Trace
	mark(MarkConfig)
	if err := makeMountPoints(cfg); err != nil {
		return nil, err
	}
	if err := attachMounts(cfg, fds); err != nil {
		return nil, err
	}
	mark(MarkAttached)
	if err := mountRoot(cfg, fds, kit); err != nil {
		return nil, err
	}
	mark(MarkMounted)
	if err := enterRoot(cfg); err != nil {
		return nil, err
	}
	mark(MarkEntered)
	stopRelax()
	if err := becomeSandboxed(sync, cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// prepare is the first of the setup, before the wait for a Config.
func prepare() error {
	// First of all, before the wait for a Config (an init may be started
	// long before its sandbox): no mount or unmount on the host reaches
	// this namespace any more, so another sandbox's writable layer
	// mounted meanwhile is never copied in here and pinned.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	// Then, while the process has the fewest threads (each change is made
	// on every one), the capability bounding set is bounded. This keeps
	// the effective capabilities the setup needs; it bounds what any exec
	// or capset can gain later. The spawner starts the init with
	// GOMAXPROCS=1 (InitEnv), so that the runtime has started no thread
	// for a second P by now: each of the thirty-odd drops stops and
	// signals every thread, and waits for each to run it. (The in-sandbox
	// binary's entry point has usually made them already, on its one
	// thread: see boundCapabilities.)
	if err := boundCapabilities(); err != nil {
		return err
	}
	// The agent gets at most agentProcs of the machine's CPUs. A GOMAXPROCS
	// set explicitly (here, and by the environment before) is never
	// updated from the cgroup the init started in.
	runtime.GOMAXPROCS(min(runtime.NumCPU(), agentProcs))
	return nil
}

// ahead is what the init does while it waits for its Config, on the
// thread it keeps locked; it returns the trees built ahead.
func ahead() trees {
	// The namespace and mount calls below act on this thread (unshare)
	// or are checked against it; it stays the one until every thread has
	// dropped its privileges.
	runtime.LockOSThread()
	// Also ahead of the Config: the agent's code is mapped in.
	prefault()
	// The Config's decoding is readied: encoding/json builds its decoder
	// for a type at first use, which would otherwise be on the create's path.
	warmDecoder()
	// And the sandbox's /proc, /sys and /dev are built (trees_linux.go).
	// A kernel that cannot build them detached gets them at attachTrees.
	kit, err := buildTrees()
	if err != nil {
		return noTrees
	}
	return kit
}

// scratchMode bounds the tmpfs of the init's mount points: a few
// directories, no file.
const scratchMode = "mode=0700,size=4k,nr_inodes=64"

// makeMountPoints mounts the init's tmpfs on cfg.Scratch and makes the
// mount points of the template, the layers and the root in it.
func makeMountPoints(cfg *Config) error {
	if cfg.Scratch == "" {
		return nil
	}
	points := append([]string{cfg.LowerDir, cfg.RootDir}, cfg.LayerDirs...)
	for _, d := range points {
		if filepath.Dir(d) != cfg.Scratch || filepath.Clean(d) != d {
			return fmt.Errorf("mount point %q is not a child of %q", d, cfg.Scratch)
		}
	}
	if err := unix.Mount("tmpfs", cfg.Scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, scratchMode); err != nil {
		return fmt.Errorf("mounting the mount points' tmpfs: %w", err)
	}
	for _, d := range points {
		if err := unix.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("making mount point: %w", err)
		}
	}
	return nil
}

// attachMounts places the agent's listener and attaches the template, the
// frozen layers and the writable layer received with cfg.
func attachMounts(cfg *Config, fds []int) error {
	lower := fds[0]
	unix.CloseOnExec(SyncFD)
	// The agent's listener travels last; it takes the place kept for it
	// at ListenerFD, where the agent takes it.
	if cfg.Listener {
		ln := fds[len(fds)-1]
		if err := unix.Dup3(ln, listenerFD, 0); err != nil {
			return fmt.Errorf("placing the agent's listener: %w", err)
		}
		unix.Close(ln)
	}
	if err := unix.MoveMount(lower, "", unix.AT_FDCWD, cfg.LowerDir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching template: %w", err)
	}
	unix.Close(lower)
	// Frozen layers the sandbox boots on (checkpoints, snapshots) travel
	// after the binds, top first, and sit above the template.
	for i, d := range cfg.LayerDirs {
		fd := fds[1+len(cfg.Binds)+i]
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, d, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attaching layer: %w", err)
		}
		unix.Close(fd)
	}
	if cfg.DiskDir != "" {
		fd := fds[1+len(cfg.Binds)+len(cfg.LayerDirs)]
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, cfg.DiskDir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attaching writable layer: %w", err)
		}
		unix.Close(fd)
	}
	return nil
}

// mountRoot mounts the sandbox's root overlay over its layers, with its
// /proc, /sys, /dev, binds and /tmp.
func mountRoot(cfg *Config, fds []int, kit trees) error {
	// The layers are named through descriptors, so the sandbox's
	// mountinfo shows /proc/self/fd/N rather than the host's state paths.
	openLayer := func(d string) (string, error) {
		fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("opening overlay layer: %w", err)
		}
		return fdPath(fd), nil // closed with the others below
	}
	var lowers []string
	for _, d := range append(slices.Clone(cfg.LayerDirs), cfg.LowerDir) {
		p, err := openLayer(d)
		if err != nil {
			return err
		}
		lowers = append(lowers, p)
	}
	upper, err := openLayer(cfg.UpperDir)
	if err != nil {
		return err
	}
	work, err := openLayer(cfg.WorkDir)
	if err != nil {
		return err
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,userxattr", strings.Join(lowers, ":"), upper, work)
	if err := unix.Mount("overlay", cfg.RootDir, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mounting root overlay: %w", err)
	}
	root := cfg.RootDir
	if err := attachTrees(root, kit, cfg.ShmBytes); err != nil {
		return err
	}
	for i, b := range cfg.Binds {
		if err := attachBind(root, fds[i+1], b); err != nil {
			return fmt.Errorf("binding %s: %w", b.Path, err)
		}
	}
	if err := ensureTmp(root); err != nil {
		return err
	}
	return nil
}

// enterRoot names the sandbox's host, brings its loopback up, pivots into
// its root and sets its limits.
func enterRoot(cfg *Config) error {
	if err := unix.Sethostname([]byte(cfg.ID)); err != nil {
		return fmt.Errorf("setting hostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return err
	}
	if err := pivot(cfg.RootDir); err != nil {
		return err
	}
	if err := setRlimits(cfg.NoFile); err != nil {
		return err
	}
	return nil
}

// becomeSandboxed closes the host's descriptors, waits for the daemon's
// go-ahead and leaves the process with what every process of the sandbox
// has: its cgroup namespace, its privileges and the agent's environment.
func becomeSandboxed(sync *os.File, cfg *Config) error {
	// Every descriptor the setup received or opened names something of
	// the host's (the layers' directories, the template's tree): none
	// may outlive it in a process of the sandbox's.
	if err := closeDescriptors(); err != nil {
		return err
	}
	mark(MarkClosed)
	// In its cgroups on every hierarchy (InCgroups, or after the
	// go-ahead): a cgroup namespace entered then is rooted there, so
	// /proc/self/cgroup reads / everywhere and names no host path.
	if cfg.InCgroups {
		if err := enterCgroupNamespace(); err != nil {
			return err
		}
	}
	// Nothing of the sandbox's runs before the daemon has placed this
	// process in the sandbox's cgroups, with their limits, and attached
	// its network.
	buf := make([]byte, 1)
	if n, err := sync.Read(buf); err != nil || n != 1 || buf[0] != GoAhead {
		return fmt.Errorf("waiting for the daemon: %v", err)
	}
	mark(MarkGoAhead)
	if !cfg.InCgroups {
		if err := enterCgroupNamespace(); err != nil {
			return err
		}
	}
	mark(MarkCgroupNS)
	if err := dropPrivileges(cfg.Seccomp, cfg.NoSetFCap); err != nil {
		return err
	}
	mark(MarkPrivs)
	// The agent's environment, as a program started with it would have
	// it: it passes no part of its own on to the commands it runs.
	os.Clearenv()
	if err := os.Setenv("PATH", strings.TrimPrefix(boot.DefaultPath, "PATH=")); err != nil {
		return fmt.Errorf("setting the agent's environment: %w", err)
	}
	return nil
}

// warmConfig is a Config with every field set (TestWarmConfigSetsEveryField).
const warmConfig = `{"id":"w","scratch":"/s","lowerDir":"/l","rootDir":"/r","upperDir":"/u","workDir":"/w",` +
	`"diskDir":"/d","listener":true,"binds":[{"path":"/b","isDir":true}],"layerDirs":["/x"],` +
	`"noFile":1,"noSetFCap":true,"seccomp":"BgAAAAAA/38=","shmBytes":1,"trace":true,` +
	`"agent":{"envVars":{"K":"V"},"defaultUser":"u","defaultWorkdir":"/h"},"inCgroups":true}`

// warmDecoder decodes warmConfig, so that the Config the init waits for is
// decoded by encoding/json's cached decoder, with its code paged in.
func warmDecoder() {
	var c Config
	_ = json.Unmarshal([]byte(warmConfig), &c)
}

func receiveConfig(sync *os.File) (*Config, []int, error) {
	buf := make([]byte, 1<<20)
	oob := make([]byte, unix.CmsgSpace(4*(MaxBinds+MaxLayers+3))) // + template, disk, listener
	n, oobn, _, _, err := unix.Recvmsg(int(sync.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("receiving config: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, nil, errors.New("receiving config: no template descriptor")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) < 1 {
		return nil, nil, errors.New("receiving config: no template descriptor")
	}
	var cfg Config
	if err := json.Unmarshal(buf[:n], &cfg); err != nil {
		return nil, nil, fmt.Errorf("decoding config: %w", err)
	}
	want := len(cfg.Binds) + len(cfg.LayerDirs) + 1
	if cfg.DiskDir != "" {
		want++
	}
	if cfg.Listener {
		want++
	}
	if len(fds) != want {
		return nil, nil, fmt.Errorf("receiving config: %d descriptors for %d binds and %d layers", len(fds), len(cfg.Binds), len(cfg.LayerDirs))
	}
	return &cfg, fds, nil
}

// shmInodes is the inode limit of a /dev/shm of the given size: one inode
// per 4 KiB page, at most 16,384. An empty file costs kernel memory (inode
// and dentry, about 1 KiB) but no page, so without this limit a loop of
// touch could pin far more memory than the size allows.
func shmInodes(size int64) int64 {
	return max(min(size/4096, 16384), 64)
}

func ensureTmp(root string) error {
	fd, err := openInRoot(root, "/tmp", kindDir)
	if err != nil {
		return fmt.Errorf("preparing /tmp: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmodat(unix.AT_FDCWD, fdPath(fd), 0o1777, 0); err != nil {
		return fmt.Errorf("preparing /tmp: %w", err)
	}
	return nil
}

// MaxBinds bounds the binds one sandbox may have.
const MaxBinds = 64

// MaxLayers bounds the frozen layers one sandbox boots on.
const MaxLayers = 32

// attachBind attaches the detached mount tree at its target inside root.
func attachBind(root string, tree int, b BindTarget) error {
	defer unix.Close(tree)
	kind := kindFile
	if b.IsDir {
		kind = kindDir
	}
	return attach(root, b.Path, kind, tree)
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

type pathKind int

const (
	kindExisting pathKind = iota // must exist, any type
	kindDir                      // created as a directory if missing
	kindFile                     // created as an empty file if missing
)

// openInRoot opens path inside root as an O_PATH descriptor, resolving every
// component inside root (RESOLVE_IN_ROOT: a symlink cannot lead out of it)
// and creating missing components as the kind asks.
func openInRoot(root, path string, kind pathKind) (int, error) {
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(rootFD)
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	parts := strings.Split(strings.Trim(filepath.Clean(path), "/"), "/")
	for i := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		last := i == len(parts)-1
		fd, err := unix.Openat2(rootFD, prefix, how)
		if err == nil {
			if last {
				return fd, nil
			}
			unix.Close(fd)
			continue
		}
		if !errors.Is(err, unix.ENOENT) || kind == kindExisting {
			return -1, err
		}
		parent := rootFD
		if i > 0 {
			if parent, err = unix.Openat2(rootFD, strings.Join(parts[:i], "/"), &unix.OpenHow{
				Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: how.Resolve}); err != nil {
				return -1, err
			}
		}
		if last && kind == kindFile {
			f, cerr := unix.Openat2(parent, parts[i], &unix.OpenHow{
				Flags: unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY | unix.O_CLOEXEC, Mode: 0o644,
				Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS})
			if cerr == nil {
				unix.Close(f)
			}
			err = cerr
		} else {
			err = unix.Mkdirat(parent, parts[i], 0o755)
		}
		if parent != rootFD {
			unix.Close(parent)
		}
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, err
		}
		fd, err = unix.Openat2(rootFD, prefix, how)
		if err != nil {
			return -1, err
		}
		if last {
			return fd, nil
		}
		unix.Close(fd)
	}
	return unix.Openat2(rootFD, ".", how)
}

func loopbackUp() error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bringing up loopback: %w", err)
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("bringing up loopback: %w", err)
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing up loopback: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing up loopback: %w", err)
	}
	return nil
}

func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("entering root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("entering new root: %w", err)
	}
	return nil
}

func setRlimits(noFile uint64) error {
	var cur unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &cur); err != nil {
		return fmt.Errorf("reading RLIMIT_NOFILE: %w", err)
	}
	n := min(noFile, cur.Max)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n}); err != nil {
		return fmt.Errorf("setting RLIMIT_NOFILE: %w", err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("setting RLIMIT_CORE: %w", err)
	}
	return nil
}

// closeDescriptors closes every descriptor above the agent's (listener,
// lifeline), except the Go runtime's own poller (an epoll instance and its
// eventfd, which name nothing). Descriptors are listed in /proc, the
// sandbox's own by now.
func closeDescriptors() error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("listing descriptors: %w", err)
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= lifelineFD {
			continue
		}
		target, err := os.Readlink(fdPath(fd))
		if err != nil {
			// The directory's own, closed by ReadDir already (EBADF);
			// any other is closed unnamed.
			if err := unix.Close(fd); err != nil && !errors.Is(err, unix.EBADF) {
				return fmt.Errorf("closing descriptor %d: %w", fd, err)
			}
			continue
		}
		if target == "anon_inode:[eventpoll]" || target == "anon_inode:[eventfd]" {
			continue
		}
		if err := unix.Close(fd); err != nil {
			return fmt.Errorf("closing descriptor %d (%s): %w", fd, target, err)
		}
	}
	return nil
}

// prefault maps the pages of this binary's code and read-only data into
// the process: an init started ahead does it while it waits, so the agent
// does not take a page fault on each first use of its code while a
// sandbox's first command waits. The pages are the page cache's, shared
// by every sandbox; only the page tables are this process's. Best effort.
func prefault() {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return
	}
	for line := range strings.Lines(string(maps)) {
		f := strings.Fields(line)
		if len(f) < 6 || f[5] != exe || strings.Contains(f[1], "w") {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_POPULATE_READ)
	}
}
