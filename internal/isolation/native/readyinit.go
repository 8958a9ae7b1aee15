package native

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/cgroup"
	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
	"github.com/fencesandbox/fence/internal/insandbox/spawnrole"
	"github.com/fencesandbox/fence/internal/isolation"
)

// readyInit is a sandbox's init process before it knows its sandbox: cloned
// into new user, mount, pid, net, uts, ipc and time namespaces with a uid
// slot of its own, its Go runtime started, waiting on its sync socket for
// the Config, the mounts and the listener that make it one sandbox's
// (package nsinit). Starting it is most of what an init costs; a backend
// with Options.ReadyInits keeps some ahead of the creates, made off the
// request path. Nothing in it belongs to any sandbox yet: the template,
// binds, writable layer, listener, cgroup, network and hostname all come
// at take time, so one ready init serves any create.
type readyInit struct {
	proc   *spawned
	slot   *slot
	sync   *os.File      // the daemon's end of the sync socket
	life   *os.File      // the daemon's end of the agent's lifeline, which carries its stderr
	exited chan struct{} // closed once the process has exited and been waited for
	// cg, when not nil, is the cgroup the init waits in, its own (cgroup
	// v1, see ownGroup): the create that takes it renames it to its
	// sandbox's instead of moving the init.
	cg *cgroup.Group
}

// spawnInit clones a new init (see readyInit). cgfd, when not -1, is the
// cgroup (v2) the init starts in.
func (b *Backend) spawnInit(cgfd int) (_ *readyInit, err error) {
	b.markExeInUse()
	sl, err := b.slots.acquire()
	if err != nil {
		return nil, err
	}
	r := &readyInit{slot: sl, exited: make(chan struct{})}
	var closers []*os.File
	defer func() {
		for _, f := range closers {
			f.Close()
		}
		if err != nil {
			r.discard()
		}
	}()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating sync socket: %w", err)
	}
	r.sync = os.NewFile(uintptr(pair[0]), "sync-parent")
	child := os.NewFile(uintptr(pair[1]), "sync-child")
	closers = append(closers, child)
	// The lifeline and the stderr of init and agent are one socket pair:
	// the agent reads its end (its lifeline) and exits, ending the
	// sandbox, on EOF, i.e. when this process has died (the daemon
	// never writes to it); init and agent write their stderr to the same
	// end, read here with a small buffer (an io.Writer would cost a
	// 32 KiB copy buffer per sandbox in os/exec). One descriptor of the
	// daemon's per sandbox, where a pipe each way took two. A sandbox
	// never outlives the daemon (or `fence run`) that supervises it; the
	// next start removes what is left on the host.
	life, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating lifeline: %w", err)
	}
	_ = unix.SetNonblock(life[0], true) // read in the poller
	r.life = os.NewFile(uintptr(life[0]), "lifeline")
	lifeChild := os.NewFile(uintptr(life[1]), "lifeline-child")
	closers = append(closers, lifeChild)
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", os.DevNull, err)
	}
	closers = append(closers, devNull)
	hostUID := sl.hostUID()
	// fd 3: sync, 4: the listener's place (the listener itself comes with
	// the Config), 5: lifeline. The role's name, "init", is also what
	// the in-sandbox binary's entry point looks for (see boundCapabilities).
	proc, err := b.spawner.spawn(spawnrole.Request{
		Path:        b.inExe,
		Args:        []string{"fence", "init"},
		Env:         nsinit.InitEnv,
		Dir:         "/",
		Cloneflags:  cloneFlags,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(hostUID), Size: uidRange}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(hostUID), Size: uidRange}},
		Setsid:      true,
	}, []*os.File{devNull, devNull, lifeChild, child, devNull, lifeChild}, cgfd)
	if err != nil {
		return nil, fmt.Errorf("starting sandbox init: %w", err)
	}
	r.proc = proc
	go func() {
		proc.Wait()
		close(r.exited)
	}()
	return r, nil
}

// alive reports whether the init has not exited.
func (r *readyInit) alive() bool {
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// discard ends an init no sandbox took and releases what it holds.
func (r *readyInit) discard() {
	if r.proc != nil {
		_ = r.proc.Kill()
		select {
		case <-r.exited:
		case <-time.After(10 * time.Second):
		}
	}
	for _, f := range []*os.File{r.sync, r.life} {
		if f != nil {
			f.Close()
		}
	}
	if r.cg != nil {
		_ = r.cg.Remove(context.Background())
	}
	if r.slot != nil {
		r.slot.release()
	}
}

// takeInit returns a ready init, or one made now when none is ready. The
// caller places it in its sandbox's cgroups, and calls refill once its
// create is done: only then is the init's place in the pool filled again.
// A new init's start (tens of milliseconds of CPU) would otherwise run
// beside the create that took its predecessor, at the same low weight as
// that init until the create moves it into its sandbox's cgroups, and
// slow the one thing the create waits for.
//
// refill is given a channel closed when the sandbox is killed: the
// replacement may wait for it, or for the init's exit (refillAfter).
func (b *Backend) takeInit() (r *readyInit, refill func(killed <-chan struct{}), err error) {
	for {
		select {
		case r := <-b.ready:
			if r.alive() {
				var once sync.Once
				return r, func(killed <-chan struct{}) {
					once.Do(func() { b.room <- refillAfter{killed: killed, exited: r.exited} })
				}, nil
			}
			b.room <- refillAfter{}
			r.discard()
			continue
		default:
		}
		r, err := b.spawnInit(-1)
		return r, func(<-chan struct{}) {}, err
	}
}

// refillAfter is a token of the ready pool's room: the sandbox whose
// take freed it. Its zero value is an init lost or discarded, replaced at
// once.
type refillAfter struct {
	killed <-chan struct{} // closed when the sandbox is killed
	exited <-chan struct{} // closed when its init has exited
}

// A create is usually followed at once by its sandbox's first command, and
// the init that replaces the one it took would start beside that command:
// its runtime's start and package initialisation (tens of milliseconds of
// CPU, at the lowest weight), and the daemon's clone of its namespaces,
// its cgroup made on every hierarchy and its move into it (which holds
// back every fork and exit on the machine while it waits for an RCU grace
// period). On a machine of two cores that made a fresh sandbox's first
// command wait two to three times as long as it works. So the refill of a
// take waits until the sandbox that took the init is killed or has ended
// (an SDK's create, command, kill), refillDefer has passed, or no init is
// left ready, whichever comes first: an emptied pool is refilled at once, as are
// inits lost or discarded. refillDefer is a variable for tests.
var refillDefer = 50 * time.Millisecond

// waitRefill waits, before the refill of a take, until refillDefer has
// passed, the sandbox is killed or has ended, no init is ready or ctx
// ends.
func (b *Backend) waitRefill(ctx context.Context, after refillAfter) {
	t := time.NewTimer(refillDefer)
	defer t.Stop()
	tick := time.NewTicker(5 * time.Millisecond) // how soon an emptied pool is seen
	defer tick.Stop()
	for len(b.ready) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case <-after.killed:
			return
		case <-after.exited:
			return
		case <-tick.C:
		}
	}
}

// readyInitRetry is how long the filler waits after a failed spawn.
const readyInitRetry = time.Second

// readyGroup is the cgroup ready inits wait in until a create moves them
// into their sandbox's. It is not a sandbox ID (those have no '_'), so
// Cleanup leaves it alone.
const readyGroup = "_ready"

// readyLimits bound the ready inits together: they start in the
// background with the lowest CPU weight, so that they run on idle CPU and
// do not slow the creates and sandboxes they are made for. There is no
// CPU quota: on cgroup v1 the init of a create that found none ready is
// born here too (startReady) until its create moves it, and a quota spent
// by the refill would stall it, and its create, until the next period
// (creates of 150-450 ms at the 99th percentile with half a core). The
// task limit leaves room for the spawner and those passing inits.
//
// Their memory is not limited here. An init becomes its sandbox's agent
// without an exec, and the kernel moves no memory charge with a process
// that changes cgroup: what an init's runtime took while it waited (about
// 1.25 MiB: its heap, stacks and page tables) stays charged to this group
// for as long as its agent lives, so the group holds that much per live
// sandbox, bounded by the number of sandboxes. A limit here would make
// the creates fail once enough sandboxes were alive. ReadyMemory reports
// the charge.
func readyLimits(n int) cgroup.Limits {
	return cgroup.Limits{Pids: int64(n)*64 + readyPidsSpare, Weight: readyWeight}
}

// readyWeight is the ready inits' CPU weight, the lowest.
const readyWeight = 2

// readyPidsSpare is the room readyLimits leaves beyond the ready inits'
// own: the spawner's threads and the inits passing through (each is a Go
// runtime of a few threads when its create moves it out).
const readyPidsSpare = 4096

// ReadyMemory is the memory charged to the ready inits' cgroup: the ready
// inits' and what the agents they became took before their sandboxes
// existed (see readyLimits). Zero without ready inits.
func (b *Backend) ReadyMemory() int64 {
	if b.readyCg == nil {
		return 0
	}
	st, err := b.readyCg.Stats()
	if err != nil {
		return 0
	}
	return st.MemoryBytes
}

// fillReady keeps Options.ReadyInits inits in b.ready (one per token of
// b.room) until ctx ends, then discards what it holds. A token of a
// take is refilled after waitRefill; a zero one at once.
func (b *Backend) fillReady(ctx context.Context) {
	defer func() {
		for {
			select {
			case r := <-b.ready:
				r.discard()
			default:
				return
			}
		}
	}()
	for {
		var after refillAfter
		select {
		case after = <-b.room:
		case <-ctx.Done():
			return
		}
		if after != (refillAfter{}) {
			b.waitRefill(ctx, after)
		}
		r, err := b.spawnReady()
		if err != nil {
			if !errors.Is(err, errSpawnerClosed) {
				b.log.Warn("starting a ready sandbox init", "err", err)
			}
			b.room <- refillAfter{}
			select {
			case <-ctx.Done():
				return
			case <-time.After(readyInitRetry):
			}
			continue
		}
		b.ready <- r // room was taken for it
	}
}

// spawnReady starts an init for the ready pool, in the ready cgroup.
func (b *Backend) spawnReady() (*readyInit, error) {
	cgfd := -1
	if fd, ok := b.readyCg.FD(); ok {
		cgfd = fd
	}
	r, err := b.spawnInit(cgfd)
	if err != nil {
		return nil, err
	}
	if cgfd < 0 {
		if err := b.ownGroup(r); err != nil {
			r.discard()
			return nil, err
		}
	}
	return r, nil
}

// ownGroupPids bounds the tasks of a ready init in its own cgroup when the
// sandboxes have no task limit by default: its runtime's threads, a
// handful.
const ownGroupPids = 64

// ownGroupLimits are the limits of a ready init's own cgroup: a sandbox's
// by default (Options.Defaults), at the ready inits' weight. The create
// that takes the init writes only what its sandbox's limits change (its
// weight, at least): each control file written is an open, a write and a
// close on the create's way to its go-ahead, and a CPU quota's has the
// kernel check every CPU cgroup on the host.
func (b *Backend) ownGroupLimits() cgroup.Limits {
	d := withDefaults(isolation.Limits{}, b.opts.Defaults)
	l := cgroup.Limits{CPUs: d.CPUs, MemoryBytes: d.MemoryBytes, Pids: d.Pids, Weight: readyWeight}
	if l.Pids == 0 {
		l.Pids = ownGroupPids
	}
	return l
}

// ownGroup moves a ready init, on cgroup v1, into a cgroup of its own
// (readyGroup-SLOT, at the ready inits' weight and a sandbox's default
// limits, ownGroupLimits), which the create that takes it renames to its sandbox's and gives the sandbox's limits
// (cgroup.Manager.Rename). Moving a process between cgroups on v1 waits
// for an RCU grace period on every hierarchy, milliseconds each and tens
// of them on a busy machine: here the move is made while the init waits,
// off the create's path. (cgroup v2 clones each init into the ready
// group and moves it at the create: it cannot rename a group.) A
// crashed daemon's groups of this kind are removed by the next
// startReady.
func (b *Backend) ownGroup(r *readyInit) error {
	g, err := b.cg.Create(readyGroup+"-"+strconv.Itoa(r.slot.n), b.ownGroupLimits())
	if err != nil {
		return fmt.Errorf("creating a ready init's cgroup: %w", err)
	}
	r.cg = g
	if err := g.AddProc(r.proc.Pid); err != nil {
		return fmt.Errorf("placing a ready init in its cgroup: %w", err)
	}
	return nil
}

// removeOwnGroups removes the groups of ready inits (ownGroup) that a
// crashed daemon left, with whatever they hold.
func (b *Backend) removeOwnGroups(ctx context.Context) error {
	ids, err := b.cg.List()
	if err != nil {
		return fmt.Errorf("listing cgroups: %w", err)
	}
	var errs []error
	for _, id := range ids {
		if !strings.HasPrefix(id, readyGroup+"-") {
			continue
		}
		if g, err := b.cg.Open(id); err == nil {
			if err := g.Remove(ctx); err != nil {
				errs = append(errs, fmt.Errorf("removing a ready init's cgroup: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// startReady starts the filler of Options.ReadyInits; Close stops it.
func (b *Backend) startReady(ctx context.Context) error {
	// A crashed daemon's groups go first, with whatever they still hold,
	// also for a backend that keeps no ready inits (one that cleans up
	// after a crashed instance, CleanupStale).
	if err := b.removeOwnGroups(ctx); err != nil {
		return err
	}
	if g, err := b.cg.Open(readyGroup); err == nil {
		if err := g.Remove(ctx); err != nil {
			return fmt.Errorf("removing the ready inits' cgroup: %w", err)
		}
	}
	n := b.opts.ReadyInits
	if n <= 0 {
		return nil
	}
	g, err := b.cg.Create(readyGroup, readyLimits(n))
	if err != nil {
		return fmt.Errorf("creating the ready inits' cgroup: %w", err)
	}
	b.readyCg = g
	// Without a cgroup to clone into (cgroup v1), the spawner itself
	// moves into this one, so that its children, the inits, are born in
	// it: they start at this group's weight, not at the daemon's, and
	// need no move of their own. Before this, every ready init ran its
	// runtime's start (tens of milliseconds of CPU) at the daemon's
	// weight, beside the create that took its predecessor and that
	// sandbox's first command. An init started for a create that found
	// none ready is born here too, and the create moves it out at once.
	if _, ok := g.FD(); !ok {
		b.spawner.setPlace(g.AddProc)
	}
	b.ready = make(chan *readyInit, n)
	b.room = make(chan refillAfter, n)
	for range n {
		b.room <- refillAfter{}
	}
	fctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	b.stopReady = stop
	b.readyDone = make(chan struct{})
	go func() {
		defer close(b.readyDone)
		b.fillReady(fctx)
	}()
	return nil
}

// stopReadyInits ends the filler, the inits it holds and their cgroup.
func (b *Backend) stopReadyInits() {
	if b.stopReady == nil {
		return
	}
	b.stopReady()
	<-b.readyDone
	_ = b.readyCg.Remove(context.Background())
}

// exeTouchEvery is how often a backend in use moves its in-sandbox
// binary's mtime to now: binaries of other builds unused for a week are
// removed (package embedded), and a daemon runs for longer than that.
const exeTouchEvery = time.Hour

// markExeInUse moves the in-sandbox binary's mtime to now, at most once
// per exeTouchEvery.
func (b *Backend) markExeInUse() {
	now := time.Now()
	if last := b.exeTouched.Load(); now.UnixNano()-last < int64(exeTouchEvery) || b.inExe == b.exe {
		return
	}
	b.exeTouched.Store(now.UnixNano())
	_ = os.Chtimes(b.inExe, now, now)
}
