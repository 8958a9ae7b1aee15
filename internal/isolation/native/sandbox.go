package native

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
	"github.com/fencesandbox/fence/internal/isolation"
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
	limit     isolation.Limits
	usage     usageReading // the last reading of its use (Stats)
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
	// ckptMu serialises the sandbox's checkpoints on the copy store (the
	// next takes the index the last leaves, updated in place).
	ckptMu sync.Mutex
	// watch records the changes to the writable layer since the previous
	// checkpoint (watch.go); nil until the first checkpoint starts it.
	// +checklocks:pmu
	watch *changeWatch
	// watched counts the checkpoints made from the watcher's record.
	watched atomic.Int64
	// looked is how many keys of the index by inode the last checkpoint
	// looked at (inodes.go).
	looked atomic.Int64
	// examined is how many entries of the writable layer the last
	// checkpoint read.
	examined atomic.Int64
	// squashing lists the layers a squash of its checkpoints in progress
	// reads and makes (squash.go); nil when none runs.
	// +checklocks:pmu
	squashing []string
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
	lifeline *os.File      // the daemon's end of the agent's lifeline (and stderr) socket
	trace    *CreateTrace  // the create's steps when creates are traced (TraceCreates), else nil
	done     chan struct{} // closed when the init/agent process has exited
	// killing is closed when Kill is called: the ready init that replaces
	// this sandbox's may start then (takeInit).
	killing  chan struct{}
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
	tr := b.traces.begin()
	// The sandbox's init (readyinit.go), with its uid slot and lifeline,
	// from the start: the sandbox ends when it does.
	r, refill, err := b.takeInit()
	if err != nil {
		return nil, err
	}
	killing := make(chan struct{})
	defer refill(killing)
	if initTaken != nil {
		initTaken()
	}
	defer r.sync.Close() // used by start alone
	tr.mark(MarkTook)
	s := &sandbox{
		trace:    tr,
		b:        b,
		id:       spec.ID,
		limit:    limits,
		done:     r.exited,
		killing:  killing,
		proc:     r.proc,
		slot:     r.slot,
		lifeline: r.life,
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
	// The sandboxes of this ID alone (byID), not every one alive: a
	// create's cost does not grow with the sandboxes alive.
	for _, o := range b.byID[spec.ID] {
		liveVisits.Add(1)
		if !o.ended() && !spec.Standby && !o.standby.Load() {
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
	b.addLive(s)
	b.mu.Unlock()

	defer func() {
		if err != nil {
			s.teardown(context.WithoutCancel(ctx))
		}
	}()
	go (&limitedLog{s: s, left: 16 << 10}).drain(r.life)
	cl := cgroup.Limits{CPUs: limits.CPUs, MemoryBytes: limits.MemoryBytes, Pids: limits.Pids}
	if spec.Background {
		cl.Weight = backgroundWeight
	}
	// The init's cgroups and network come beside the rest of the create
	// (attach); the go-ahead waits for both. A ready init's group gets
	// the sandbox's CPU weight first, at once (one write, which waits for
	// no lock of the cgroup tree): the init's setup runs at it from its
	// Config on, not at the ready inits' lowest.
	ready := r.cg
	r.cg = nil
	if ready != nil {
		if err := ready.SetWeight(cl.Weight); err != nil {
			_ = ready.Remove(context.WithoutCancel(ctx)) // and the init in it
			return nil, fmt.Errorf("creating cgroup: %w", err)
		}
	}
	tr.mark(MarkCgroup)
	attached := s.attach(ctx, spec.Network, ready, cl)
	defer func() {
		if err != nil {
			attached() // before the teardown (deferred earlier, run later)
		}
	}()
	cfg, err := s.prepareDirs(ctx, spec, limits)
	if err != nil {
		return nil, err
	}
	// A ready init's group becomes the sandbox's by its name alone: the
	// init is in the sandbox's cgroups already and may enter its cgroup
	// namespace before the go-ahead.
	cfg.InCgroups = ready != nil
	tr.mark(MarkDirs)
	// The agent's listener: the agent is handed a copy, and this one
	// is closed once the create is over, so that an idle sandbox holds
	// no descriptor of the daemon's for it (and a dial after the agent's
	// death is refused rather than left in a backlog no one accepts).
	ln, err := listenUnix(s.sock)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	tr.mark(MarkListener)
	if err := s.start(ctx, spec, cfg, r.sync, ln, attached); err != nil {
		return nil, err
	}
	b.traces.add(tr)
	return s, nil
}

// attach gives the sandbox's init its cgroups (joinCgroups) and attaches
// its network (a TUN device in its netns, read by a user-space stack
// here), both in the background, while the sandbox's directories are made
// and its init builds its root: a cgroup's rename, like every change of
// cgroup v1's tree, waits for the cgroup lock, which a move of a task
// anywhere on the host holds across an RCU grace period (milliseconds, tens
// on a busy machine), and the network takes a few more. Until they end the
// init runs fence's setup alone, in the ready init's group or the
// daemon's (its pids, memory and CPU bounded as the ready inits are): it
// waits for the go-ahead, sent after both, before running anything of the
// sandbox's. The returned function waits for both and returns their error;
// it may be called more than once, and s.cg is set once it has returned.
func (s *sandbox) attach(ctx context.Context, nw isolation.Network, ready *cgroup.Group, cl cgroup.Limits) func() error {
	pid := s.proc.Pid
	cg := make(chan error, 1)
	go func() {
		err := s.joinCgroups(ready, cl, pid)
		s.trace.mark(MarkJoined)
		cg <- err
	}()
	net := make(chan error, 1)
	go func() {
		err := s.startNetwork(ctx, pid, nw)
		s.trace.mark(MarkNetwork)
		net <- err
	}()
	return sync.OnceValue(func() error { return errors.Join(<-cg, <-net) })
}

// cgroupsJoin, when set (by tests), is called by a create as its cgroups'
// step begins, beside the rest of the create, with the sandbox's key and
// its init's pid.
var cgroupsJoin func(key string, pid int)

// joinCgroups puts the init pid in the sandbox's cgroups with limits cl
// and sets s.cg (also on failure, when a group is left for the teardown
// to remove). ready, when not nil, is the group the init waits in
// (readyInit.cg): it gets the sandbox's limits, then its name, and the
// init never moves (a rename is no migration). Without one the group is
// made and the init moved into it.
func (s *sandbox) joinCgroups(ready *cgroup.Group, cl cgroup.Limits, pid int) error {
	if cgroupsJoin != nil {
		cgroupsJoin(s.key, pid)
	}
	if ready == nil {
		g, err := s.b.cg.Create(s.key, cl)
		if err != nil {
			return fmt.Errorf("creating cgroup: %w", err)
		}
		s.cg = g
		if err := g.AddProc(pid); err != nil {
			return fmt.Errorf("placing sandbox in its cgroup: %w", err)
		}
		return nil
	}
	// The limits first (the weight is set already, see create), then the
	// name.
	s.cg = ready
	if err := ready.Reset(cl); err != nil {
		return fmt.Errorf("creating cgroup: %w", err)
	}
	g, err := s.b.cg.Rename(ready, s.key)
	if err != nil {
		return fmt.Errorf("creating cgroup: %w", err)
	}
	s.cg = g
	return nil
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
	// The mount points of the template, the layers and the root are the
	// init's, on a tmpfs it mounts in its own mount namespace: none is
	// made on the host's disk, whose metadata writes wait for its
	// journal (a millisecond or more each on a busy machine).
	scratch := s.b.scratchDir()
	cfg := &nsinit.Config{
		ID:       s.id,
		Scratch:  scratch,
		LowerDir: filepath.Join(scratch, "lower"),
		RootDir:  filepath.Join(scratch, "root"),
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
		cfg.LayerDirs = append(cfg.LayerDirs, filepath.Join(scratch, "l"+strconv.Itoa(i)))
	}
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("creating sandbox directory: %w", err)
		}
	}
	// Its resolver is the daemon's, inside its network stack.
	resolv := filepath.Join(upper, "etc", "resolv.conf")
	// The sandbox's own /etc/hosts names its hostname (sudo wants it).
	etc := filepath.Join(upper, "etc")
	if err := os.Mkdir(etc, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
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
	for _, d := range []string{dir, disk} {
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
func (s *sandbox) start(ctx context.Context, spec isolation.Spec, cfg *nsinit.Config, syncSock *os.File, ln *net.UnixListener, attached func() error) error {
	proc := s.proc
	hostUID := s.slot.hostUID()
	lnFile, err := ln.File() // a dup; closed below
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
		fd, isDir, rootsRW, err := -1, true, false, error(nil)
		if bd.Volume != "" {
			// A volume's files carry the sandbox's ids, as its template's.
			fd, err = idmappedTree(bd.HostPath, userns, bd.ReadOnly)
		} else {
			fd, isDir, rootsRW, err = s.bindTree(ctx, bd, hostUID)
		}
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
	cfg.Trace = s.trace != nil
	fds = append(fds, int(lnFile.Fd()))
	msg, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encoding init config: %w", err)
	}
	if err := unix.Sendmsg(int(syncSock.Fd()), msg, unix.UnixRights(fds...), nil, 0); err != nil {
		return fmt.Errorf("sending init config: %w", err)
	}
	s.trace.mark(MarkSent)
	if err := attached(); err != nil {
		return err
	}
	s.trace.mark(MarkAttached)
	protectAgent(proc.Pid)
	s.trace.mark(MarkGoAhead)
	if _, err := syncSock.Write([]byte{nsinit.GoAhead}); err != nil {
		return fmt.Errorf("starting sandbox: %w", err)
	}
	// The child answers with an error message, or nsinit.Started once it
	// serves as the agent. EOF alone means it died on the way (an agent
	// that cannot make a thread under the sandbox's pids limit).
	reply := make(chan []byte, 1)
	go func() {
		buf := make([]byte, max(4096, nsinit.TraceLen))
		n, _ := syncSock.Read(buf)
		reply <- buf[:max(n, 0)]
	}()
	select {
	case r := <-reply:
		marks, ok, err := nsinit.ParseStarted(r)
		switch {
		case err != nil:
			return fmt.Errorf("setting up sandbox: %w", err)
		case !ok:
			return fmt.Errorf("setting up sandbox: %s", bytes.TrimSpace(r))
		}
		s.trace.mark(MarkStarted)
		if s.trace != nil {
			s.trace.Init = marks
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
