package gvisor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/agent/boot"
	"github.com/fencesandbox/fence/internal/cgroup"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netfence"
)

// cgroupLimits are the host cgroup's limits of a sandbox with limits l.
// Its tasks are gVisor's, not the host's: the host group holds the sentry,
// its gofer and the systrap stubs, whose threads grow with the sandbox's
// tasks, so its pids limit is a bound on those (hostPids), and the
// sandbox's own task count is bounded inside gVisor (RLIMIT_NPROC).
func cgroupLimits(l isolation.Limits) cgroup.Limits {
	return cgroup.Limits{CPUs: l.CPUs, MemoryBytes: l.MemoryBytes, Pids: hostPids(l.Pids)}
}

// hostPids is the host pids limit for a sandbox of pids tasks.
func hostPids(pids int64) int64 { return 4*pids + 512 }

// record is what a sandbox's directory says about it: enough for a later
// daemon to restore its checkpoint (see Adopt). It is written by the
// daemon alone, outside anything the sandbox can reach.
type record struct {
	ID     string           `json:"id"`
	RootFS string           `json:"rootfs"`
	Limits isolation.Limits `json:"limits"`
	Agent  boot.Config      `json:"agent"`
	// Volumes are the fence volumes bound in (Spec.Binds, all with
	// Volume set), writable, through the gofer.
	Volumes []isolation.Bind `json:"volumes,omitempty"`
}

// sandbox is one gVisor sandbox.
type sandbox struct {
	b   *Backend
	id  string
	dir string
	rec record
	cg  *cgroup.Group
	// base is the layer the sandbox booted on, "" for its template alone.
	base string

	done     chan struct{}
	doneOnce sync.Once
	killOnce sync.Once
	killErr  error

	// nw is the sandbox's fence (Spec.Network, or Adopt's): each run
	// attaches its own network namespace to it.
	nw isolation.Network

	// pmu serialises Pause, Resume, Kill and the end of a run.
	pmu sync.Mutex
	// paused is set from the start of a checkpoint until a restore has
	// finished: DialAgent and DialPort refuse at once.
	paused atomic.Bool
	// +checklocks:pmu
	killed bool
	nmu    sync.Mutex
	// +checklocks:nmu
	netns *os.File // the current run's network namespace
	// net is the current run's namespace attached to nw; nil while
	// paused.
	net atomic.Pointer[isolation.Link]
}

var (
	_ isolation.Sandbox = (*sandbox)(nil)
	_ isolation.Pauser  = (*sandbox)(nil)
)

// Create implements isolation.Backend.
func (b *Backend) Create(ctx context.Context, spec isolation.Spec) (isolation.Sandbox, error) {
	return b.create(ctx, spec, layerMeta{})
}

// create makes a sandbox for spec, booted on layer (a zero layerMeta for
// the template alone).
func (b *Backend) create(ctx context.Context, spec isolation.Spec, layer layerMeta) (_ isolation.Sandbox, err error) {
	if spec.ID == "" {
		spec.ID = isolation.NewID()
	}
	if !idPattern.MatchString(spec.ID) {
		return nil, fmt.Errorf("invalid sandbox id %q", spec.ID)
	}
	if st, err := os.Stat(spec.RootFS); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("template root %q is not a directory", spec.RootFS)
	}
	if err := checkVolumes(spec.Binds); err != nil {
		return nil, err
	}
	s := &sandbox{
		b:    b,
		id:   spec.ID,
		dir:  filepath.Join(b.sbDir, spec.ID),
		done: make(chan struct{}),
		rec: record{ID: spec.ID, RootFS: spec.RootFS, Limits: withDefaults(spec.Limits, b.opts.Defaults),
			Agent: spec.Agent, Volumes: spec.Binds},
		base: layer.ID,
	}
	s.nw = cmp.Or(spec.Network, b.opts.Network)
	if s.nw == nil {
		return nil, errors.New("creating sandbox: no network fence in the spec")
	}
	if err := b.register(s); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Kill(context.WithoutCancel(ctx))
		}
	}()
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating sandbox directory: %w", err)
	}
	if err := s.prepareFiles(); err != nil {
		return nil, err
	}
	if err := writeJSON(filepath.Join(s.dir, "record.json"), s.rec); err != nil {
		return nil, err
	}
	l := s.rec.Limits
	if s.cg, err = b.cg.Create(s.id, cgroupLimits(l)); err != nil {
		return nil, fmt.Errorf("creating cgroup: %w", err)
	}
	var image, fsImage string
	switch layer.Kind {
	case layerMemory:
		image = filepath.Join(b.layerDir(layer.ID), "image")
	case layerFiles:
		fsImage = filepath.Join(b.layerDir(layer.ID), "image")
	}
	if err := s.startRun(ctx, image, fsImage); err != nil {
		return nil, err
	}
	if image != "" {
		// The restored agent has the memory of the layer's source, its
		// environment included: it takes this sandbox's.
		if err := isolation.ConfigureAgent(ctx, s, s.rec.Agent); err != nil {
			return nil, fmt.Errorf("restoring sandbox %s: %w", s.id, err)
		}
	}
	return s, nil
}

func (b *Backend) register(s *sandbox) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, dup := b.live[s.id]; dup {
		return fmt.Errorf("sandbox %s already exists", s.id)
	}
	b.live[s.id] = s
	return nil
}

func writeJSON(path string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", filepath.Base(path), err)
	}
	return os.Rename(tmp, path)
}

// prepareFiles writes the files bound read-only into the sandbox: its
// hosts, its resolver, and the CA it trusts.
func (s *sandbox) prepareFiles() error {
	files := filepath.Join(s.dir, "files")
	if err := os.Mkdir(files, 0o755); err != nil {
		return fmt.Errorf("creating sandbox files: %w", err)
	}
	content := map[string]string{
		"hosts":       "127.0.0.1\tlocalhost " + s.id + "\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"resolv.conf": "nameserver " + egress.ResolverIPv4.String() + "\nnameserver " + egress.ResolverIPv6.String() + "\n",
	}
	if ca := s.b.opts.TrustedCA; len(ca) > 0 {
		bundle, err := caBundle(s.rec.RootFS, ca)
		if err != nil {
			return err
		}
		content["ca-bundle.crt"] = string(bundle)
		content["ca.pem"] = string(ca)
	}
	for name, c := range content {
		if err := os.WriteFile(filepath.Join(files, name), []byte(c), 0o644); err != nil {
			return fmt.Errorf("writing sandbox %s: %w", name, err)
		}
	}
	if err := os.Mkdir(filepath.Join(s.dir, "overlay"), 0o700); err != nil {
		return fmt.Errorf("creating overlay directory: %w", err)
	}
	return nil
}

// caBundle returns the template's CA bundle with ca appended, read inside
// the template's root (a symlink in the template cannot point elsewhere).
func caBundle(rootfs string, ca []byte) ([]byte, error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil, fmt.Errorf("opening template root: %w", err)
	}
	defer root.Close()
	var base []byte
	if f, err := root.Open("etc/ssl/certs/ca-certificates.crt"); err == nil {
		st, _ := f.Stat()
		if st != nil && st.Mode().IsRegular() && st.Size() < 8<<20 {
			base = make([]byte, st.Size())
			n, _ := f.Read(base)
			base = base[:n]
		}
		f.Close()
	} else if !errors.Is(err, fs.ErrNotExist) {
		base = nil
	}
	out := append([]byte{}, base...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	out = append(out, "# fence egress gateway\n"...)
	return append(out, ca...), nil
}

// ociSpec is the sandbox's OCI runtime spec, its network namespace at
// netns.
func (s *sandbox) ociSpec(netns string) (*specs.Spec, error) {
	// The agent listens on the sandbox's own address and serves the
	// daemon's end of its network alone (DialAgent comes from the stack's
	// GatewayIPv4): no process of the sandbox can send from that address
	// (gVisor binds only local addresses and has no raw sockets here, and
	// adding an address takes CAP_NET_ADMIN), so none can drive the agent.
	env, err := boot.Env(s.rec.Agent, &boot.TCP{
		Listen: netip.AddrPortFrom(egress.SandboxIPv4.Addr(), boot.Port),
		Peer:   egress.GatewayIPv4,
	})
	if err != nil {
		return nil, err
	}
	ro := func(dst, src string) specs.Mount {
		return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "ro", "nosuid", "nodev"}}
	}
	files := filepath.Join(s.dir, "files")
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		ro(boot.Path, s.b.exe),
		ro("/usr/bin/sudo", s.b.exe),
		ro("/etc/hosts", filepath.Join(files, "hosts")),
		ro("/etc/resolv.conf", filepath.Join(files, "resolv.conf")),
	}
	for _, v := range s.rec.Volumes {
		// A volume's files carry the sandbox's ids, which are the host's
		// here (gVisor runs no user namespace): no mapping is needed. The
		// gofer serves it with runsc's default shared file access for
		// mounts, so other sandboxes' writes are seen.
		mounts = append(mounts, specs.Mount{Destination: v.Path, Type: "bind", Source: v.HostPath,
			Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}
	if len(s.b.opts.TrustedCA) > 0 {
		mounts = append(mounts,
			ro("/etc/ssl/certs/ca-certificates.crt", filepath.Join(files, "ca-bundle.crt")),
			ro("/etc/fence/ca.pem", filepath.Join(files, "ca.pem")))
	}
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
		"CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE", "CAP_SETFCAP"}
	nofile := s.rec.Limits.NoFile
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: append([]string{boot.Path}, boot.Argv[1:]...), // argv[0] is the path to run
			Env:  env,
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile},
				// gVisor's tasks are not host tasks: the cgroup's pids limit
				// bounds the sentry's threads, this one the sandbox's tasks.
				{Type: "RLIMIT_NPROC", Hard: uint64(s.rec.Limits.Pids), Soft: uint64(s.rec.Limits.Pids)},
			},
			NoNewPrivileges: true,
		},
		// Not read-only: gVisor's root overlay (sandboxFlags) takes every
		// write; the gofer serves the template as its read-only lower.
		Root:     &specs.Root{Path: s.rec.RootFS},
		Hostname: s.id,
		Mounts:   mounts,
		Linux: &specs.Linux{
			CgroupsPath: "/" + filepath.Join("fence", s.b.opts.Instance, s.id),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace, Path: netns},
			},
		},
	}, nil
}

// sandboxFlags are the runsc flags of this sandbox's create and restore.
func (s *sandbox) sandboxFlags() []string {
	return []string{"--overlay2", fmt.Sprintf("root:dir=%s,size=%dm", filepath.Join(s.dir, "overlay"), max(s.rec.Limits.DiskBytes>>20, 1))}
}

// startRun starts a run of the sandbox: a fresh network namespace,
// attached to the sandbox's fence, then `runsc run` (image empty; on the filesystem checkpoint
// fsImage if set) or `runsc restore` of image. It returns once the agent
// accepts connections.
func (s *sandbox) startRun(ctx context.Context, image, fsImage string) (err error) {
	ns, err := netfence.NewNetNS()
	if err != nil {
		return err
	}
	nsPath := fmt.Sprintf("/proc/self/fd/%d", ns.Fd())
	// runsc, not a kernel, is the device's other end (see
	// netfence.Fence.Attach).
	st, err := s.nw.Attach(ctx, s.id, nsPath, false)
	if err != nil {
		ns.Close()
		return err
	}
	s.nmu.Lock()
	s.netns = ns
	s.nmu.Unlock()
	s.net.Store(&st)
	defer func() {
		if err != nil {
			s.endRun()
		}
	}()
	spec, err := s.ociSpec(fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), ns.Fd()))
	if err != nil {
		return err
	}
	bundle := filepath.Join(s.dir, "bundle")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return fmt.Errorf("creating bundle: %w", err)
	}
	if err := writeJSON(filepath.Join(bundle, "config.json"), spec); err != nil {
		return err
	}
	pidFile := filepath.Join(s.dir, "pid")
	os.Remove(pidFile)
	// runsc's messages and the agent's stderr (warnings only): truncated
	// at every run.
	out, err := os.OpenFile(filepath.Join(s.dir, "runsc.out"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating runsc output: %w", err)
	}
	defer out.Close()
	if image == "" {
		args := []string{"run", "--detach", "--bundle", bundle, "--pid-file", pidFile}
		if fsImage != "" {
			args = append(args, "--fs-restore-image-path", fsImage)
		}
		err = s.b.runOut(ctx, out, s.sandboxFlags(), append(args, s.id)...)
	} else {
		err = s.b.runOut(ctx, out, s.sandboxFlags(), "restore", "--detach", "--bundle", bundle, "--pid-file", pidFile,
			"--image-path", image, s.id)
	}
	if err != nil {
		return fmt.Errorf("starting gvisor sandbox: %w", err)
	}
	pid, err := readPid(pidFile)
	if err != nil {
		return err
	}
	go s.watch(pid)
	t0 := time.Now()
	err = s.waitAgent(ctx, st)
	s.b.log.Debug("sandbox run started", "sandbox_id", s.id, "restored", image != "", "agent_wait", time.Since(t0))
	return err
}

func readPid(path string) (int, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading sandbox pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("reading sandbox pid: %q", raw)
	}
	return pid, nil
}

// agentWait bounds how long a start or restore waits for the agent.
const agentWait = 30 * time.Second

// waitAgent returns once the agent accepts a connection.
func (s *sandbox) waitAgent(ctx context.Context, st isolation.Link) error {
	ctx, cancel := context.WithTimeout(ctx, agentWait)
	defer cancel()
	for {
		c, err := st.DialSandbox(ctx, boot.Port)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-s.done:
			return errors.New("starting gvisor sandbox: the sandbox exited at start")
		case <-ctx.Done():
			return fmt.Errorf("starting gvisor sandbox: the agent did not answer: %w", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// watch waits for the run's sandbox process (pid) to exit. The end of a
// run by a pause is not the end of the sandbox; any other end is.
func (s *sandbox) watch(pid int) {
	waitExit(pid)
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if s.paused.Load() && !s.killed {
		return
	}
	s.closeDone()
}

func (s *sandbox) closeDone() { s.doneOnce.Do(func() { close(s.done) }) }

// waitExit returns once process pid has exited.
func waitExit(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone already
	}
	defer unix.Close(fd)
	for {
		_, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
		if err != unix.EINTR {
			return
		}
	}
}

// endRun closes the current run's network link and namespace.
func (s *sandbox) endRun() {
	if st := s.net.Swap(nil); st != nil {
		if err := (*st).Close(); err != nil {
			s.b.log.Warn("closing sandbox network", "sandbox_id", s.id, "err", err)
		}
	}
	s.nmu.Lock()
	if s.netns != nil {
		s.netns.Close()
		s.netns = nil
	}
	s.nmu.Unlock()
}

// ID implements isolation.Sandbox.
func (s *sandbox) ID() string { return s.id }

// Done implements isolation.Sandbox.
func (s *sandbox) Done() <-chan struct{} { return s.done }

// DialAgent implements isolation.Sandbox.
func (s *sandbox) DialAgent(ctx context.Context) (net.Conn, error) {
	return s.dial(ctx, boot.Port, "agent")
}

func (s *sandbox) dial(ctx context.Context, port uint16, what string) (net.Conn, error) {
	select {
	case <-s.done:
		return nil, fmt.Errorf("dialing %s: %w", what, isolation.ErrNotFound)
	default:
	}
	if s.paused.Load() {
		return nil, fmt.Errorf("dialing %s: %w", what, isolation.ErrPaused)
	}
	st := s.net.Load()
	if st == nil {
		return nil, fmt.Errorf("dialing %s: %w", what, isolation.ErrPaused)
	}
	return (*st).DialSandbox(ctx, port)
}

// Stats implements isolation.Sandbox.
func (s *sandbox) Stats(ctx context.Context) (isolation.Stats, error) {
	st, err := s.cg.Stats()
	if err != nil {
		return isolation.Stats{}, fmt.Errorf("reading cgroup stats: %w", err)
	}
	return isolation.Stats{
		CPUUsage:    st.CPUUsage,
		MemoryBytes: st.MemoryBytes,
		MemoryLimit: s.rec.Limits.MemoryBytes,
		Pids:        st.Pids,
		DiskBytes:   dirBytes(filepath.Join(s.dir, "overlay")),
		DiskLimit:   s.rec.Limits.DiskBytes,
	}, nil
}

// dirBytes is the disk space the files directly in dir take.
func dirBytes(dir string) int64 {
	ents, _ := os.ReadDir(dir)
	var n int64
	for _, e := range ents {
		var st unix.Stat_t
		if unix.Lstat(filepath.Join(dir, e.Name()), &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

// Kill implements isolation.Sandbox: it deletes the runsc container (its
// processes die with the sandbox process) and releases every host
// resource: network, cgroup, directory (checkpoint image included).
func (s *sandbox) Kill(ctx context.Context) error {
	s.killOnce.Do(func() {
		s.pmu.Lock()
		s.killed = true
		s.pmu.Unlock()
		ctx := context.WithoutCancel(ctx)
		var errs []error
		if err := s.b.run(ctx, nil, "delete", "--force", s.id); err != nil && !notExist(err) {
			errs = append(errs, err)
		}
		s.closeDone()
		s.endRun()
		if s.cg != nil {
			if err := s.cg.Remove(ctx); err != nil {
				errs = append(errs, fmt.Errorf("removing cgroup: %w", err))
			}
		}
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("removing sandbox directory: %w", err))
		}
		s.b.mu.Lock()
		delete(s.b.live, s.id)
		s.b.mu.Unlock()
		s.killErr = errors.Join(errs...)
	})
	return s.killErr
}

// notExist reports whether a runsc error says the container is unknown.
func notExist(err error) bool {
	m := err.Error()
	return strings.Contains(m, "does not exist") || strings.Contains(m, "not found") || strings.Contains(m, "no such file")
}

// liveLocked reports an error wrapping isolation.ErrNotFound for a killed
// or stopped sandbox.
//
// +checklocks:s.pmu
func (s *sandbox) liveLocked() error { return isolation.Gone(s.id, s.done, s.killed) }

// checkVolumes accepts fence volumes alone among binds (a host path is
// `fence run -v`'s, which runs native sandboxes), at clean absolute paths
// that cover nothing of the sandbox's own.
func checkVolumes(binds []isolation.Bind) error {
	for _, b := range binds {
		if b.Volume == "" {
			return fmt.Errorf("host binds are not supported on the gvisor backend: %w", isolation.ErrUnsupported)
		}
		p := b.Path
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" || !filepath.IsAbs(b.HostPath) {
			return fmt.Errorf("volume target %q: want a clean absolute path other than /: %w", p, isolation.ErrUnsupported)
		}
		for _, reserved := range []string{"/proc", "/sys", "/dev", boot.Path} {
			if p == reserved || strings.HasPrefix(p, reserved+"/") {
				return fmt.Errorf("volume target %q: %s is reserved: %w", p, reserved, isolation.ErrUnsupported)
			}
		}
	}
	return nil
}
