package native

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/agent/boot"
	"github.com/fencesandbox/fence/internal/cgroup"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native/nsinit"
	"github.com/fencesandbox/fence/internal/quota"
)

// sandbox is one running native sandbox.
type sandbox struct {
	b  *Backend
	id string
	// key names the sandbox's host resources (state directory, socket,
	// cgroup, writable layer) and its entry in Backend.live: its ID, or,
	// while an earlier sandbox of the same ID (killed, a rewind's or a
	// filesystem-only resume's predecessor) is still being released, its
	// ID and a suffix, so the new one never waits for that release.
	key string
	// standby is set while the sandbox is a Spec.Standby one not yet
	// handed over (Foreground).
	standby atomic.Bool
	sock    string
	slot    *slot
	cg      *cgroup.Group
	// cgRemoved is set once the killed sandbox's cgroup is gone (by the
	// release goroutine alone).
	cgRemoved bool
	proc      *spawned // the sandbox's init (then agent)
	ln        *net.UnixListener
	limit     isolation.Limits
	// rootfs is the template's root; base the layer the sandbox booted on
	// ("" for none) and chain that layer and its parents, top first.
	rootfs string
	base   string
	chain  []string
	// gen holds the files fence wrote into the writable layer at create,
	// by path inside, with their mtime then (see Changes).
	gen map[string]unix.Timespec
	// installed holds the same files with their ctime then: the forensics
	// archive leaves out those still as fence wrote them.
	installed map[string]unix.Timespec
	// last is the previous checkpoint (checkpoint.go).
	// +checklocks:pmu
	last *lastCheckpoint
	// lastUsage is the subvolume's usage at the previous checkpoint (the
	// btrfs store, layerfs.go).
	// +checklocks:pmu
	lastUsage int64

	// net is the sandbox's network namespace attached to its fence
	// (Spec.Network); nil until attached. release closes it.
	net isolation.Link
	// diskDir is the writable layer's mount point on the host while the
	// sandbox is created; diskFD its root, kept for usage readings once
	// the host's mount is detached (see detachDisk). -1 when none.
	diskDir  string
	diskFD   int
	detached chan struct{} // closed once the host's mount is detached; nil if never started
	lifeline *os.File      // write end of the agent's lifeline pipe
	done     chan struct{} // closed when the init/agent process has exited
	killOnce sync.Once
	killErr  error

	// pmu serialises Pause, Resume and the start of Kill.
	pmu sync.Mutex
	// paused is set while the sandbox's cgroup is frozen (or being
	// frozen): DialAgent and DialPort refuse at once.
	paused atomic.Bool
	// +checklocks:pmu
	killed bool
	// gone is set once Kill has made sure no process of the sandbox can
	// run again (their exits may still be under way).
	gone atomic.Bool

	// layerMu guards diskFD against release while an export opens the
	// layer; layerGone is set once it is released.
	layerMu   sync.RWMutex
	layerGone bool
}

var (
	_ isolation.Sandbox = (*sandbox)(nil)
	_ isolation.Pauser  = (*sandbox)(nil)
)

// initTaken, when set (by tests), is called by a create once it has its
// init, before anything else.
var initTaken func()

// Create implements isolation.Backend.
func (b *Backend) Create(ctx context.Context, spec isolation.Spec) (isolation.Sandbox, error) {
	return b.create(ctx, spec, "")
}

// create makes a sandbox booting on layer ("" for the template alone).
func (b *Backend) create(ctx context.Context, spec isolation.Spec, layer string) (_ isolation.Sandbox, err error) {
	if spec.ID == "" {
		spec.ID = isolation.NewID()
	}
	if !idPattern.MatchString(spec.ID) {
		return nil, fmt.Errorf("invalid sandbox id %q", spec.ID)
	}
	if st, err := os.Stat(spec.RootFS); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("template root %q is not a directory", spec.RootFS)
	}
	if err := checkBinds(spec.Binds); err != nil {
		return nil, err
	}
	// A create waits while the teardown of killed sandboxes is too far
	// behind: their cgroups, layers and loop devices are still held, and
	// a new sandbox would add to them and slow their release.
	wctx, cancel := context.WithTimeout(ctx, backlogWait)
	n, werr := b.pending.waitRoom(wctx)
	cancel()
	if werr != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for the release of %d killed sandboxes: %w", n, ctx.Err())
		}
		return nil, fmt.Errorf("the release of %d killed sandboxes is behind, try again: %w", n, api.ErrUnavailable)
	}
	limits := withDefaults(spec.Limits, b.opts.Defaults)
	// The sandbox's init (readyinit.go), with its uid slot and lifeline,
	// from the start: the sandbox ends when it does.
	r, refill, err := b.takeInit()
	if err != nil {
		return nil, err
	}
	defer refill()
	if initTaken != nil {
		initTaken()
	}
	defer r.sync.Close() // used by start alone
	s := &sandbox{
		b:        b,
		id:       spec.ID,
		limit:    limits,
		done:     r.exited,
		proc:     r.proc,
		slot:     r.slot,
		lifeline: r.lifeW,
		diskFD:   -1,
		rootfs:   spec.RootFS,
		base:     layer,
	}
	if layer != "" {
		if s.chain, err = b.layerChain(layer); err != nil {
			r.discard()
			return nil, err
		}
	}
	b.mu.Lock()
	s.key = spec.ID
	s.standby.Store(spec.Standby)
	for _, o := range b.live {
		if o.id == spec.ID && !o.ended() && !spec.Standby && !o.standby.Load() {
			b.mu.Unlock()
			r.discard()
			return nil, fmt.Errorf("sandbox %s already exists", spec.ID)
		}
	}
	if _, taken := b.live[spec.ID]; taken {
		s.key = spec.ID + "r" + isolation.NewID()[:8]
		if _, taken := b.live[s.key]; taken || len(s.key) > idPattern.max {
			b.mu.Unlock()
			r.discard()
			return nil, fmt.Errorf("sandbox %s is still being released, try again: %w", spec.ID, api.ErrUnavailable)
		}
	}
	s.sock = b.sockPath(s.key)
	b.live[s.key] = s
	b.mu.Unlock()

	defer func() {
		if err != nil {
			s.teardown(context.WithoutCancel(ctx))
		}
	}()
	go (&limitedLog{s: s, left: 16 << 10}).drain(r.errR)
	cl := cgroup.Limits{CPUs: limits.CPUs, MemoryBytes: limits.MemoryBytes, Pids: limits.Pids}
	if spec.Background {
		cl.Weight = backgroundWeight
	}
	if s.cg, err = b.cg.Create(s.key, cl); err != nil {
		return nil, fmt.Errorf("creating cgroup: %w", err)
	}
	attached := s.attach(ctx, spec.Network)
	defer func() {
		if err != nil {
			attached() // before the teardown (deferred earlier, run later)
		}
	}()
	cfg, err := s.prepareDirs(ctx, spec, limits)
	if err != nil {
		return nil, err
	}
	if s.ln, err = listenUnix(s.sock); err != nil {
		return nil, err
	}
	if err := s.start(ctx, spec, cfg, r.sync, attached); err != nil {
		return nil, err
	}
	return s, nil
}

// attach places the sandbox's init in its cgroups and attaches its network
// (a TUN device in its netns, read by a user-space stack here), both in the
// background: joining cgroups takes ~2.5 ms per v1 hierarchy (an RCU grace
// period each) and the network a few more, and they run while the
// sandbox's directories are made and its init builds its root. The init
// waits for the go-ahead, sent after both, before running anything of the
// sandbox's. The returned function waits for both and returns their error;
// it may be called more than once.
func (s *sandbox) attach(ctx context.Context, nw isolation.Network) func() error {
	pid := s.proc.Pid
	cg := make(chan error, 1)
	go func() {
		if err := s.cg.AddProc(pid); err != nil {
			cg <- fmt.Errorf("placing sandbox in its cgroup: %w", err)
			return
		}
		cg <- nil
	}()
	net := make(chan error, 1)
	go func() { net <- s.startNetwork(ctx, pid, nw) }()
	return sync.OnceValue(func() error { return errors.Join(<-cg, <-net) })
}

// checkBinds refuses binds that would cover what the sandbox's security
// rests on.
func checkBinds(binds []isolation.Bind) error {
	if len(binds) > nsinit.MaxBinds {
		return fmt.Errorf("%d binds: at most %d", len(binds), nsinit.MaxBinds)
	}
	for _, bd := range binds {
		p := bd.Path
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("bind target %q: want a clean absolute path other than /", p)
		}
		for _, reserved := range []string{"/proc", "/sys", "/dev", "/.fence"} {
			if p == reserved || strings.HasPrefix(p, reserved+"/") {
				return fmt.Errorf("bind target %q: %s is reserved", p, reserved)
			}
		}
		if !filepath.IsAbs(bd.HostPath) {
			return fmt.Errorf("bind source %q: want an absolute path", bd.HostPath)
		}
	}
	return nil
}

// prepareDirs creates the sandbox's state directory and writable layer,
// owned by the sandbox's root uid.
func (s *sandbox) prepareDirs(ctx context.Context, spec isolation.Spec, limits isolation.Limits) (*nsinit.Config, error) {
	uid := int(s.slot.hostUID())
	dir := filepath.Join(s.b.sbDir, s.key)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating sandbox directory: %w", err)
	}
	cfg := &nsinit.Config{
		ID:       s.id,
		LowerDir: filepath.Join(dir, "lower"),
		RootDir:  filepath.Join(dir, "root"),
		NoFile:   limits.NoFile,
		ShmBytes: nsinit.DefaultShmBytes,
		Agent:    spec.Agent,
	}
	if !s.b.opts.NoSeccomp {
		prog, err := s.b.seccompFilter()
		if err != nil {
			return nil, err
		}
		cfg.Seccomp = prog
	}
	disk := filepath.Join(dir, "disk")
	// hostDisk is the writable layer's directory on the host, owned by
	// owner: the sandbox's root uid, or 0 in the btrfs store, where the
	// sandbox sees it through an idmapped mount at cfg.DiskDir.
	hostDisk, owner := disk, uid
	if s.b.lfs != nil {
		d, fd, err := s.b.lfs.newDir(s.key, limits.DiskBytes)
		if err != nil {
			return nil, err
		}
		s.diskFD, hostDisk, owner = fd, d, 0
		cfg.DiskDir = disk
		if err := os.Mkdir(disk, 0o700); err != nil {
			return nil, fmt.Errorf("creating writable layer: %w", err)
		}
	} else if s.b.disk != nil {
		d, err := s.b.disk.NewDir(ctx, s.key, limits.DiskBytes)
		if err != nil {
			return nil, fmt.Errorf("creating writable layer: %w", err)
		}
		disk, s.diskDir = d, d
	} else if err := os.Mkdir(disk, 0o700); err != nil {
		return nil, fmt.Errorf("creating writable layer: %w", err)
	}
	if s.b.lfs == nil {
		hostDisk = disk
	}
	cfg.UpperDir = filepath.Join(disk, "upper")
	cfg.WorkDir = filepath.Join(disk, "work")
	upper, work := filepath.Join(hostDisk, "upper"), filepath.Join(hostDisk, "work")
	for i := range s.chain {
		cfg.LayerDirs = append(cfg.LayerDirs, filepath.Join(dir, "l"+strconv.Itoa(i)))
	}
	for _, d := range append([]string{cfg.LowerDir, cfg.RootDir, upper, work}, cfg.LayerDirs...) {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("creating sandbox directory: %w", err)
		}
	}
	// Its resolver is the daemon's, inside its network stack.
	resolv := filepath.Join(upper, "etc", "resolv.conf")
	// The sandbox's own /etc/hosts names its hostname (sudo wants it).
	etc := filepath.Join(upper, "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		return nil, fmt.Errorf("creating sandbox /etc: %w", err)
	}
	hosts := filepath.Join(etc, "hosts")
	content := "127.0.0.1\tlocalhost " + s.id + "\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	if err := os.WriteFile(hosts, []byte(content), 0o644); err != nil {
		return nil, fmt.Errorf("writing sandbox /etc/hosts: %w", err)
	}
	// sudo is fence's: with no_new_privs a setuid sudo cannot work, so
	// /usr/bin/sudo in the sandbox's own layer points at the agent's
	// sudo client (internal/agent/sudo).
	usrBin := filepath.Join(upper, "usr", "bin")
	if err := os.MkdirAll(usrBin, 0o755); err != nil {
		return nil, fmt.Errorf("creating sandbox /usr/bin: %w", err)
	}
	sudoLink := filepath.Join(usrBin, "sudo")
	if err := os.Symlink(boot.Path, sudoLink); err != nil {
		return nil, fmt.Errorf("installing sudo: %w", err)
	}
	caFiles, err := s.installCA(upper, spec.RootFS, owner)
	if err != nil {
		return nil, err
	}
	ns := "nameserver " + egress.ResolverIPv4.String() + "\nnameserver " + egress.ResolverIPv6.String() + "\n"
	if err := os.WriteFile(resolv, []byte(ns), 0o644); err != nil {
		return nil, fmt.Errorf("writing sandbox /etc/resolv.conf: %w", err)
	}
	for _, d := range append([]string{dir, disk, cfg.LowerDir, cfg.RootDir}, cfg.LayerDirs...) {
		if err := os.Lchown(d, uid, uid); err != nil {
			return nil, fmt.Errorf("chowning sandbox directory: %w", err)
		}
	}
	for _, d := range append([]string{hostDisk, upper, work, etc, hosts, resolv, filepath.Dir(usrBin), usrBin, sudoLink}, caFiles...) {
		if err := os.Lchown(d, owner, owner); err != nil {
			return nil, fmt.Errorf("chowning sandbox directory: %w", err)
		}
	}
	s.gen, s.installed = stamps(append([]string{hosts, resolv, sudoLink}, caFiles...), upper)
	// The writable layer holds what the sandbox writes: its root is the
	// sandbox's alone (init, as the sandbox's root, traverses it to mount
	// the overlay), so no other host user reaches a file below, whatever
	// the file's own mode. The sandbox directory is 0700 already.
	if err := os.Chmod(hostDisk, 0o700); err != nil {
		return nil, fmt.Errorf("restricting writable layer: %w", err)
	}
	return cfg, nil
}

func listenUnix(path string) (*net.UnixListener, error) {
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening for the agent: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	return ln, nil
}

// cloneFlags are the namespaces `fence init` is cloned into. The cgroup
// namespace is not among them: its root is the cgroup a process is in when
// it enters it, so init enters it itself once the daemon has placed it in
// the sandbox's cgroups (a cgroup namespace made at clone time would be
// rooted at the daemon's cgroup and show host paths inside).
const cloneFlags = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWTIME

// start drives the sandbox's init (s.proc, in its new namespaces, whose
// end of the sync socket is syncSock) until it has become the agent: it
// places the init in the sandbox's cgroups, attaches its network, and
// sends it its Config with the mounts and the agent's listener.
func (s *sandbox) start(ctx context.Context, spec isolation.Spec, cfg *nsinit.Config, syncSock *os.File, attached func() error) error {
	proc := s.proc
	hostUID := s.slot.hostUID()
	lnFile, err := s.ln.File() // a dup; closed below, the listener stays with us
	if err != nil {
		return fmt.Errorf("duplicating listener: %w", err)
	}
	defer lnFile.Close()
	// The limited disk's mount travels as a detached copy, as every other
	// mount does: an init started ahead has no copy of the host's later
	// mounts. The host's own mount of it can go then.
	disk := -1
	if s.diskDir != "" {
		if disk, err = unix.OpenTree(unix.AT_FDCWD, s.diskDir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC); err != nil {
			return fmt.Errorf("cloning writable layer: %w", err)
		}
		defer unix.Close(disk)
		cfg.DiskDir = s.diskDir
	}
	if err := s.detachDisk(); err != nil {
		return err
	}
	// The template and every bind travel as detached mounts, idmapped for
	// the sandbox's user namespace and made here, by the daemon: the
	// sandbox's uids need no access to the host paths.
	userns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", proc.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening sandbox user namespace: %w", err)
	}
	defer unix.Close(userns)
	lower, err := idmappedTree(spec.RootFS, userns, true)
	if err != nil {
		return err
	}
	defer unix.Close(lower)
	fds := []int{lower}
	for _, bd := range spec.Binds {
		fd, isDir, rootsRW, err := s.bindTree(ctx, bd, hostUID)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		fds = append(fds, fd)
		cfg.Binds = append(cfg.Binds, nsinit.BindTarget{Path: bd.Path, IsDir: isDir})
		cfg.NoSetFCap = cfg.NoSetFCap || rootsRW
	}
	for _, id := range s.chain {
		fd, err := idmappedTree(s.b.layerTree(id), userns, true)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		fds = append(fds, fd)
	}
	if disk >= 0 {
		fds = append(fds, disk)
	} else if cfg.DiskDir != "" {
		// The btrfs store's subvolume, idmapped as the template is: its
		// files carry the ids inside the sandbox (see layerfs.go).
		fd, err := idmappedTree(filepath.Join(s.b.lfs.sbDir, s.key), userns, false)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		fds = append(fds, fd)
	}
	cfg.Listener = true
	fds = append(fds, int(lnFile.Fd()))
	msg, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encoding init config: %w", err)
	}
	if err := unix.Sendmsg(int(syncSock.Fd()), msg, unix.UnixRights(fds...), nil, 0); err != nil {
		return fmt.Errorf("sending init config: %w", err)
	}
	if err := attached(); err != nil {
		return err
	}
	protectAgent(proc.Pid)
	if _, err := syncSock.Write([]byte{nsinit.GoAhead}); err != nil {
		return fmt.Errorf("starting sandbox: %w", err)
	}
	// The child answers with an error message, or closes its end on
	// success, as it becomes the agent.
	reply := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 4096)
		n, _ := syncSock.Read(buf)
		reply <- buf[:max(n, 0)]
	}()
	select {
	case r := <-reply:
		if len(r) > 0 {
			return fmt.Errorf("setting up sandbox: %s", bytes.TrimSpace(r))
		}
	case <-ctx.Done():
		return fmt.Errorf("setting up sandbox: %w", ctx.Err())
	case <-time.After(30 * time.Second):
		return errors.New("setting up sandbox: init did not finish in 30s")
	}
	select {
	case <-s.done:
		return errors.New("setting up sandbox: the agent exited at start")
	default:
	}
	return nil
}

// agentOOMScoreAdj is the OOM score adjustment the daemon gives a
// sandbox's agent: the last process the kernel kills when the sandbox runs
// out of memory, but still killable (-1000 would leave a sandbox whose
// agent alone exceeds the limit stuck in OOM).
const agentOOMScoreAdj = -999

// protectAgent lowers the OOM score of the sandbox's PID 1 from the host
// side, before anything of the sandbox runs. Lowering needs
// CAP_SYS_RESOURCE in the host's user namespace; a daemon without it leaves
// the score as it is, and the agent still ranks below its processes by
// raising theirs (internal/agent/process).
func protectAgent(pid int) {
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(agentOOMScoreAdj)), 0)
}

// startNetwork gives the sandbox its only way out: its network namespace
// attached to its fence, nw, whose owner keeps it (policy, proxy,
// ingress). The sandbox's own kernel is the device's other end.
func (s *sandbox) startNetwork(ctx context.Context, pid int, nw isolation.Network) error {
	if nw == nil {
		nw = s.b.opts.Network
	}
	if nw == nil {
		return errors.New("creating sandbox: no network fence in the spec")
	}
	l, err := nw.Attach(ctx, s.id, fmt.Sprintf("/proc/%d/ns/net", pid), true)
	if err != nil {
		return err
	}
	s.net = l
	return nil
}

// detachDisk removes the host's mount of the sandbox's writable layer once
// the sandbox's mount namespace has its own copy, keeping a descriptor of
// its root for usage readings. A mount namespace is cloned with every
// mount of its parent: were each sandbox's layer left mounted here, every
// create would copy (and its init then tear down) one mount per live
// sandbox, and creates would slow down as sandboxes accumulate. The layer's
// filesystem lives on in the sandbox's namespace and through the
// descriptor, and is unmounted (and its loop device freed) when both are
// gone: at kill, or when a crashed daemon's sandboxes die with it.
//
// The unmount runs beside the rest of the create: it waits for the lock
// every mount and unmount on the host takes (ready inits' mounts, other
// sandboxes' teardowns), and nothing of the create needs it done. Should
// it fail, the mount stays until the release removes the layer. The
// release waits for it.
func (s *sandbox) detachDisk() error {
	if s.diskDir == "" {
		return nil
	}
	fd, err := unix.Open(s.diskDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening writable layer: %w", err)
	}
	s.diskFD = fd
	s.detached = make(chan struct{})
	go func() {
		defer close(s.detached)
		if err := unix.Unmount(s.diskDir, unix.MNT_DETACH); err != nil {
			s.b.log.Warn("detaching a sandbox's writable layer from the host", "sandbox", s.id, "err", err)
		}
	}()
	return nil
}

// backgroundWeight is the CPU weight of a sandbox started with
// Spec.Background: a sixteenth of the default, so a warm pool's refill
// yields to the sandboxes in use on a busy machine and runs at full speed
// on an idle one.
const backgroundWeight = cgroup.DefaultWeight / 16

// BootsStandby implements isolation.StandbyBooter.
func (s *sandbox) BootsStandby() {}

// Foreground implements isolation.Foregrounder. A standby becomes the
// sandbox: its kill archives its layer from then on.
func (s *sandbox) Foreground() error {
	if err := s.cg.SetWeight(cgroup.DefaultWeight); err != nil {
		return fmt.Errorf("restoring the CPU weight of %s: %w", s.id, err)
	}
	s.standby.Store(false)
	return nil
}

// bindTree returns the detached, idmapped mount of a bind's source and
// whether it is a directory. The source is opened once, without following
// a symlink; the path the kernel gives for that descriptor passes
// isolation.CheckBindSource, and its owner is read and its tree cloned
// through the same descriptor: a path swapped meanwhile cannot change what
// is mounted.
//
// The source's owner becomes the sandbox's user on the bind, whoever it
// is (root, for a root user's project): what the sandbox's user writes
// there lands owned by that owner. Every other host id is unmapped, so
// the sandbox's root and other users can create nothing there. A
// read-only bind of a directory of root's maps nobody instead, so that
// root's files in a system place bound read-only (/etc) stay not the
// user's. rootsRW reports a writable bind of root's: the sandbox's user
// is host root there, and the sandbox must then lack CAP_SETFCAP
// (nsinit.Config.NoSetFCap).
func (s *sandbox) bindTree(ctx context.Context, bd isolation.Bind, hostUID uint32) (fd int, isDir, rootsRW bool, err error) {
	src, err := unix.Openat2(unix.AT_FDCWD, bd.HostPath, &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return -1, false, false, fmt.Errorf("bind source %s: %w", bd.HostPath, err)
	}
	defer unix.Close(src)
	opened, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", src))
	if err != nil {
		return -1, false, false, fmt.Errorf("bind source %s: %w", bd.HostPath, err)
	}
	dirs := append([]string{s.b.opts.StateDir}, s.b.opts.FenceDirs...)
	if err := isolation.CheckBindSource(opened, bd.ReadOnly, dirs...); err != nil {
		return -1, false, false, fmt.Errorf("bind source %s: %w", bd.HostPath, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return -1, false, false, fmt.Errorf("bind source %s: %w", bd.HostPath, err)
	}
	owner, group := st.Uid, st.Gid
	if owner == 0 && bd.ReadOnly {
		owner, group = nobodyID, nobodyID
	}
	if !bd.ReadOnly && (owner == 0 || group == 0) {
		if err := checkNoPrivileged(ctx, src, st.Mode&unix.S_IFMT == unix.S_IFDIR, opened); err != nil {
			return -1, false, false, fmt.Errorf("bind source %s: %w", bd.HostPath, err)
		}
	}
	bns, err := bindUserNS(s.b.exe, owner, group, hostUID+sandboxUserID)
	if err != nil {
		return -1, false, false, fmt.Errorf("bind %s: %w", bd.HostPath, err)
	}
	defer unix.Close(bns)
	tree, err := unix.OpenTree(src, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, false, false, fmt.Errorf("cloning %s: %w", bd.HostPath, err)
	}
	if err := idmap(tree, bns, bd.ReadOnly); err != nil {
		unix.Close(tree)
		return -1, false, false, fmt.Errorf("idmapping %s: %w", bd.HostPath, err)
	}
	return tree, st.Mode&unix.S_IFMT == unix.S_IFDIR, owner == 0, nil
}

// checkNoPrivileged refuses a writable bind of root's (owner or group)
// that holds a set-user-ID or set-group-ID file, or one with file
// capabilities: the sandbox's user is root there and could rewrite the
// file through a shared mapping (which, unlike write(2), keeps those
// bits), for anyone on the host to run. src is the opened source, a directory if dir, name
// the path to report it under. The sandbox itself cannot make such files
// (seccomp refuses set-id modes, NoSetFCap the capabilities); the walk
// costs a stat and an xattr read per file, only writable binds of root's
// take it, and it ends with ctx.
func checkNoPrivileged(ctx context.Context, src int, dir bool, name string) error {
	fdPath := fmt.Sprintf("/proc/self/fd/%d", src)
	if !dir {
		return checkFilePrivileged(fdPath, name, unix.Stat, unix.Getxattr)
	}
	root := fdPath + "/"
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return checkFilePrivileged(p, filepath.Join(name, strings.TrimPrefix(p, root)), unix.Lstat, unix.Lgetxattr)
	})
}

// checkFilePrivileged is checkNoPrivileged for the one file at p.
func checkFilePrivileged(p, name string, stat func(string, *unix.Stat_t) error, getxattr func(string, string, []byte) (int, error)) error {
	var st unix.Stat_t
	if err := stat(p, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		return fmt.Errorf("%w: %s is set-user-ID or set-group-ID (mode %o): the sandbox's user, root's stand-in there, could rewrite it for anyone on the host to run; remove the bit or bind read-only (:ro)", isolation.ErrBindRefused, name, st.Mode&0o7777)
	}
	if _, err := getxattr(p, "security.capability", nil); err == nil {
		return fmt.Errorf("%w: %s has file capabilities: the sandbox's user, root's stand-in there, could rewrite it for anyone on the host to run; remove them (setcap -r) or bind read-only (:ro)", isolation.ErrBindRefused, name)
	}
	return nil
}

// nobodyID is the host id a read-only bind of root's maps to the
// sandbox's user instead of root, so that root's files stay not the
// user's.
const nobodyID = 65534

// idmap makes the detached tree nosuid, nodev (and read-only) and idmapped
// through userns.
func idmap(tree, userns int, readOnly bool) error {
	set := uint64(unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if readOnly {
		set |= unix.MOUNT_ATTR_RDONLY
	}
	attr := &unix.MountAttr{Attr_set: set, Userns_fd: uint64(userns)}
	return unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr)
}

// idmappedTree returns a detached, nosuid, nodev clone of the tree at
// path, idmapped through the user namespace userns: on-disk id N appears
// as what N maps to there.
func idmappedTree(path string, userns int, readOnly bool) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return -1, fmt.Errorf("cloning %s: %w", path, err)
	}
	set := uint64(unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if readOnly {
		set |= unix.MOUNT_ATTR_RDONLY
	}
	attr := &unix.MountAttr{Attr_set: set, Userns_fd: uint64(userns)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("idmapping %s: %w", path, err)
	}
	return fd, nil
}

// ID implements isolation.Sandbox.
func (s *sandbox) ID() string { return s.id }

// ended tells whether no process of the sandbox can run any more (killed,
// or its init gone): another sandbox may then take its ID.
func (s *sandbox) ended() bool {
	if s.gone.Load() {
		return true
	}
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Done implements isolation.Sandbox.
func (s *sandbox) Done() <-chan struct{} { return s.done }

// DialAgent implements isolation.Sandbox.
func (s *sandbox) DialAgent(ctx context.Context) (net.Conn, error) {
	select {
	case <-s.done:
		return nil, fmt.Errorf("dialing agent: %w", isolation.ErrNotFound)
	default:
	}
	if s.gone.Load() {
		return nil, fmt.Errorf("dialing agent: %w", isolation.ErrNotFound)
	}
	// A frozen agent would take the connection (the kernel queues it)
	// and never answer.
	if s.paused.Load() {
		return nil, fmt.Errorf("dialing agent: %w", isolation.ErrPaused)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", s.sock)
}

// Stats implements isolation.Sandbox.
func (s *sandbox) Stats(ctx context.Context) (isolation.Stats, error) {
	// Usage, not Stats: the daemon reads every sandbox's use every few
	// seconds, a cost that grows with the sandboxes alive and is taken
	// from their creates; the limit is the sandbox's own.
	st, err := s.cg.Usage()
	if err != nil {
		return isolation.Stats{}, fmt.Errorf("reading cgroup stats: %w", err)
	}
	out := isolation.Stats{
		CPUUsage:    st.CPUUsage,
		MemoryBytes: st.MemoryBytes,
		MemoryLimit: s.limit.MemoryBytes,
		Pids:        st.Pids,
		DiskLimit:   s.limit.DiskBytes,
	}
	if s.diskFD >= 0 && s.b.lfs != nil {
		out.DiskBytes = s.b.lfs.usage(s.diskFD)
	} else if s.diskFD >= 0 {
		if u, err := quota.UsageFD(s.diskFD); err == nil {
			out.DiskBytes = u.Bytes
		}
	}
	return out, nil
}

// Kill implements isolation.Sandbox. It returns once no process of the
// sandbox can run again: every one has SIGKILL pending (signalAll). Their
// exits (with the kernel's teardown of the sandbox's namespaces) and the
// release of its host resources (cgroup, writable layer, state directory,
// uid slot) happen after, in the background, at most reapers at a time and
// at most maxPendingReleases pending (Backend.Close waits for them). A
// crash meanwhile leaves them to the next start's Cleanup, as for any
// other leftover.
func (s *sandbox) Kill(ctx context.Context) error {
	s.killOnce.Do(func() {
		s.pmu.Lock()
		s.killed = true
		frozen := s.paused.Load()
		s.pmu.Unlock()
		if frozen {
			s.killErr = s.killFrozen()
		}
		if s.killErr == nil {
			s.killErr = s.signalAll()
			if s.killErr != nil {
				// Not every process could be found: wait for the kernel to
				// end them all, as the death of PID 1 makes it do.
				s.b.log.Warn("signalling a sandbox's processes; waiting for them", "sandbox_id", s.id, "err", s.killErr)
				s.killErr = s.stop()
			}
		}
		if s.killErr == nil {
			s.gone.Store(true)
		}
		if s.killErr != nil {
			// Something of the sandbox may still run: release what can be
			// released now and tell the caller.
			s.killErr = errors.Join(s.killErr, s.release(context.WithoutCancel(ctx)))
			return
		}
		// The pending release is counted before Kill returns: past the
		// budget, Kill waits here for the teardown to catch up.
		s.b.pending.add()
		s.b.closing.Go(func() {
			defer s.b.pending.done()
			if h := s.b.reapHook; h != nil {
				h(s.id)
			}
			// The exits take no reaper: the kernel does that work.
			t0 := time.Now()
			s.awaitExit(10 * time.Second)
			s.b.reapers <- struct{}{}
			defer func() { <-s.b.reapers }()
			t1 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), reapTimeout)
			defer cancel()
			// The cgroup goes first: the sandbox no longer exists for the
			// host's accounting while its layer is archived.
			s.removeCgroup(ctx)
			t2 := time.Now()
			if !s.standby.Load() {
				s.archiveLayer()
			}
			t3 := time.Now()
			if err := s.release(ctx); err != nil {
				s.b.log.Warn("releasing a killed sandbox's host resources (the next start retries)", "sandbox_id", s.id, "err", err)
			}
			s.b.releaseTimes.add(t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), time.Since(t3))
		})
	})
	return s.killErr
}

// Pause implements isolation.Pauser: it freezes the sandbox's cgroup
// (cgroup.freeze on v2, the freezer hierarchy on v1) and returns once every
// task is frozen. Memory stays where it is, charged to the sandbox.
func (s *sandbox) Pause(ctx context.Context) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if err := s.liveLocked(); err != nil {
		return err
	}
	if s.paused.Load() {
		return nil
	}
	// A command started just before the pause gets past its start first
	// (see cgroup.Group.Settle), so that what it then waits for (a sleep,
	// a timer) counts on through the freeze instead of starting at the
	// resume.
	if waited, quiet := s.cg.Settle(ctx, s.done); !quiet {
		s.b.log.Debug("pausing a busy sandbox", "sandbox_id", s.id, "waited", waited)
	}
	// Refuse new connections before anything stops answering them.
	s.paused.Store(true)
	if err := s.cg.Freeze(); err != nil {
		if terr := s.cg.Thaw(); terr != nil {
			// Neither frozen nor thawed: the sandbox is of no use.
			return fmt.Errorf("pausing sandbox %s: %w (and thawing: %v)", s.id, err, terr)
		}
		s.paused.Store(false)
		return fmt.Errorf("pausing sandbox %s: %w", s.id, err)
	}
	return nil
}

// Resume implements isolation.Pauser: it thaws the sandbox's cgroup.
func (s *sandbox) Resume(ctx context.Context) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if err := s.liveLocked(); err != nil {
		return err
	}
	if !s.paused.Load() {
		return nil
	}
	if err := s.cg.Thaw(); err != nil {
		return fmt.Errorf("resuming sandbox %s: %w", s.id, err)
	}
	s.paused.Store(false)
	return nil
}

// liveLocked reports an error wrapping isolation.ErrNotFound for a killed
// or stopped sandbox.
//
// +checklocks:s.pmu
func (s *sandbox) liveLocked() error { return isolation.Gone(s.id, s.done, s.killed) }

// killFrozen kills every task of a paused sandbox where it stands: a
// frozen task does not act on SIGKILL until thawed, so the tasks are
// killed while frozen (cgroup.kill on v2; on v1 each is signalled inside
// a freeze) and only then thawed, and no code of the sandbox runs again.
func (s *sandbox) killFrozen() error {
	if err := s.cg.Kill(); err != nil {
		return fmt.Errorf("killing paused sandbox %s: %w", s.id, err)
	}
	if err := s.cg.Thaw(); err != nil {
		return fmt.Errorf("killing paused sandbox %s: %w", s.id, err)
	}
	return nil
}

// reapers bounds how many killed sandboxes release their host resources at
// once; reapTimeout bounds one release. maxPendingReleases bounds how many
// killed sandboxes may wait for their release (a Kill past it waits; a
// Create waits while half of it is pending, at most backlogWait).
const (
	reapers            = 2
	reapTimeout        = time.Minute
	maxPendingReleases = 64
	backlogWait        = 30 * time.Second
)

// teardown stops and releases a sandbox at once. It tolerates a partially
// created sandbox (a failed Create ends with it).
func (s *sandbox) teardown(ctx context.Context) error {
	return errors.Join(s.stop(), s.release(ctx))
}

// stop ends every process of the sandbox: SIGKILL to its PID 1 makes the
// kernel kill every process of its pid namespace, and the init is reaped
// only once they are all gone.
func (s *sandbox) stop() error {
	if s.proc != nil {
		_ = s.proc.Kill()
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			return errors.New("sandbox init did not exit")
		}
	}
	return nil
}

// release frees the host resources of a stopped sandbox, in reverse order
// of creation. What the cgroup still holds, if anything, is killed first.
func (s *sandbox) release(ctx context.Context) error {
	var errs []error
	if s.ln != nil {
		s.ln.Close()
	}
	if s.lifeline != nil {
		s.lifeline.Close()
	}
	if s.net != nil {
		// The TUN device died with the sandbox's netns; what is left is
		// the stack's memory and goroutines, whose shutdown (tens of ms)
		// need not delay anything. Close waits for it.
		st := s.net
		s.net = nil
		s.b.closing.Go(func() {
			if err := st.Close(); err != nil {
				s.b.log.Warn("closing sandbox network", "sandbox_id", s.id, "err", err)
			}
		})
	}
	if s.cg != nil && !s.cgRemoved {
		if err := s.cg.Remove(ctx); err != nil {
			errs = append(errs, fmt.Errorf("removing cgroup: %w", err))
		}
	}
	if s.detached != nil {
		<-s.detached
	}
	s.layerMu.Lock()
	s.layerGone = true
	if s.diskFD >= 0 {
		unix.Close(s.diskFD)
		s.diskFD = -1
	}
	s.layerMu.Unlock()
	if err := s.b.removeLeftovers(ctx, s.key); err != nil {
		errs = append(errs, err)
	}
	s.slot.release()
	s.b.mu.Lock()
	delete(s.b.live, s.key)
	s.b.mu.Unlock()
	return errors.Join(errs...)
}

// removeCgroup removes the cgroup of a killed sandbox ahead of the rest
// of its release; a failure is left to release, which tries again.
func (s *sandbox) removeCgroup(ctx context.Context) {
	if s.cg == nil {
		return
	}
	if err := s.cg.Remove(ctx); err == nil {
		s.cgRemoved = true
	}
}

// limitedLog forwards the first bytes a sandbox's init and agent write to
// stderr into the daemon's log and drops the rest: the sandbox must not be
// able to fill the host's log.
type limitedLog struct {
	s    *sandbox
	mu   sync.Mutex
	left int
}

func (l *limitedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.left > 0 {
		q := p[:min(len(p), l.left)]
		l.left -= len(q)
		l.s.b.log.Warn("sandbox stderr", "sandbox_id", l.s.id, "output", string(bytes.TrimSpace(q)))
	}
	return len(p), nil
}

var _ io.Writer = (*limitedLog)(nil)

// drain forwards r to the log until EOF (when the sandbox's last holder of
// its stderr is gone), reading on past the log's budget so that a chatty
// agent never blocks on a full pipe.
func (l *limitedLog) drain(r *os.File) {
	defer r.Close()
	buf := make([]byte, 512)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			l.Write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}
