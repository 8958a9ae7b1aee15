// Package fake is an in-memory isolation.Backend for control-plane tests.
// It needs no root, no namespaces and no agent binary.
//
// Each fake sandbox runs an in-process HTTP server (the "agent") reached
// through in-memory connections from DialAgent. The agent answers:
//
//   - GET /health: 204.
//   - POST /process.Process/Start: a Connect-style stream that sends one
//     start envelope at once, then a keepalive envelope every
//     Options.StreamInterval until the client goes away or the sandbox is
//     killed. Kill closes the connection mid-stream, the way a dying
//     sandbox does.
//   - anything else: 200 with a JSON Echo of the request, so proxy tests
//     can see what was forwarded.
//
// Sandboxes implement isolation.Pauser: while paused, DialAgent fails with
// isolation.ErrPaused and open streams send nothing until Resume.
//
// Sandboxes live on a Host, which stands for the machine: a Backend made on
// the same Host after a "crash" finds and cleans up what an earlier Backend
// left there, as a real backend finds leftovers on disk.
package fake

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netfence"
)

// Host holds the fake sandboxes of every Backend made on it.
type Host struct {
	mu sync.Mutex
	// +checklocks:mu
	sandboxes map[string]*Sandbox
	// +checklocks:mu
	lingering []*Sandbox // killed with LingerOnKill, servers still up
}

// Close stops the agent servers that LingerOnKill left running.
func (h *Host) Close() {
	h.mu.Lock()
	l := h.lingering
	h.lingering = nil
	h.mu.Unlock()
	for _, s := range l {
		s.srv.Close()
		s.srvWG.Wait()
	}
}

// NewHost returns an empty host.
func NewHost() *Host {
	return &Host{sandboxes: map[string]*Sandbox{}}
}

// Running returns the IDs of the sandboxes alive on the host, sorted.
func (h *Host) Running() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]string, 0, len(h.sandboxes))
	for id := range h.sandboxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Sandbox returns the live sandbox with the given ID, if any.
func (h *Host) Sandbox(id string) (*Sandbox, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sandboxes[id]
	return s, ok
}

// Options configure a Backend.
type Options struct {
	// Host is where sandboxes live. If nil, the Backend gets a host of its own.
	Host *Host
	// RequireRootFS makes Create fail unless Spec.RootFS is an existing
	// directory. The conformance suite relies on it.
	RequireRootFS bool
	// CreateHook, if set, is called at the start of Create; a non-nil error
	// fails the create (to test failure paths).
	CreateHook func(ctx context.Context, spec isolation.Spec) error
	// StreamInterval is the keepalive period of the streaming endpoint.
	// Zero means 10ms.
	StreamInterval time.Duration
	// NetNS makes Create attach the Spec's Network (when it has one) to a
	// fresh, empty network namespace, as a real backend does, and Kill
	// close the link it got: the owner's fence then runs for real (a TUN
	// device and its stack) behind a fake sandbox. It needs root.
	NetNS bool
	// Name is the backend's name; empty means "fake".
	Name string
	// LingerOnKill keeps open agent connections (and their streams) alive
	// after Kill closes Done, until Host.Close; it tests that callers act
	// on Done rather than on connections breaking.
	LingerOnKill bool
	// HealthHook, if set, is called by the agent's GET /health before it
	// answers (to hold a health check in flight).
	HealthHook func()
}

// Backend implements isolation.Backend in memory.
type Backend struct {
	opts Options
	host *Host
}

var _ isolation.Backend = (*Backend)(nil)

// New returns a fake backend.
func New(opts Options) *Backend {
	h := opts.Host
	if h == nil {
		h = NewHost()
	}
	if opts.StreamInterval == 0 {
		opts.StreamInterval = 10 * time.Millisecond
	}
	return &Backend{opts: opts, host: h}
}

// Host returns the host the backend's sandboxes live on.
func (b *Backend) Host() *Host { return b.host }

// Name implements isolation.Backend.
func (b *Backend) Name() string {
	if b.opts.Name == "" {
		return "fake"
	}
	return b.opts.Name
}

// Create implements isolation.Backend.
func (b *Backend) Create(ctx context.Context, spec isolation.Spec) (isolation.Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
	}
	if b.opts.CreateHook != nil {
		if err := b.opts.CreateHook(ctx, spec); err != nil {
			return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
		}
	}
	if spec.ID == "" {
		spec.ID = isolation.NewID()
	}
	if b.opts.RequireRootFS {
		fi, err := os.Stat(spec.RootFS)
		if err != nil {
			return nil, fmt.Errorf("creating sandbox %s: checking rootfs: %w", spec.ID, err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("creating sandbox %s: rootfs %s is not a directory", spec.ID, spec.RootFS)
		}
	}
	s := newSandbox(spec, b.opts.StreamInterval, b.opts.LingerOnKill, b.host)
	s.healthHook = b.opts.HealthHook
	if b.opts.NetNS && spec.Network != nil {
		if err := s.attach(ctx); err != nil {
			s.stop()
			return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
		}
	}
	b.host.mu.Lock()
	if _, dup := b.host.sandboxes[spec.ID]; dup {
		b.host.mu.Unlock()
		s.stop()
		return nil, fmt.Errorf("creating sandbox %s: ID in use", spec.ID)
	}
	b.host.sandboxes[spec.ID] = s
	b.host.mu.Unlock()
	return s, nil
}

// Cleanup implements isolation.Backend: it kills every sandbox on the host.
func (b *Backend) Cleanup(ctx context.Context) ([]string, error) {
	b.host.mu.Lock()
	var all []*Sandbox
	for _, s := range b.host.sandboxes {
		all = append(all, s)
	}
	b.host.mu.Unlock()
	var ids []string
	for _, s := range all {
		if err := s.Kill(ctx); err != nil {
			return ids, err
		}
		ids = append(ids, s.id)
	}
	sort.Strings(ids)
	return ids, nil
}

// Sandbox is a fake sandbox.
type Sandbox struct {
	linger bool
	id     string
	spec   isolation.Spec
	host   *Host
	start  time.Time
	ln     *pipeListener
	srv    *http.Server
	done   chan struct{}
	once   sync.Once
	srvWG  sync.WaitGroup
	netns  *os.File       // with Options.NetNS: the namespace attached
	link   isolation.Link // and its link, closed by stop
	dials  atomic.Int64   // DialAgent calls that reached the agent
	// healthHook is Options.HealthHook.
	healthHook func()

	pmu sync.Mutex
	// +checklocks:pmu
	paused bool
	// +checklocks:pmu
	thawed chan struct{} // closed by Resume; streams wait on it while paused
	// +checklocks:pmu
	pauses int
}

var (
	_ isolation.Sandbox = (*Sandbox)(nil)
	_ isolation.Pauser  = (*Sandbox)(nil)
)

// Pause implements isolation.Pauser: new agent connections are refused
// with isolation.ErrPaused and open streams stop sending until Resume.
func (s *Sandbox) Pause(ctx context.Context) error {
	select {
	case <-s.done:
		return fmt.Errorf("pausing %s: %w", s.id, isolation.ErrNotFound)
	default:
	}
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if !s.paused {
		s.paused = true
		s.thawed = make(chan struct{})
		s.pauses++
	}
	return nil
}

// Resume implements isolation.Pauser.
func (s *Sandbox) Resume(ctx context.Context) error {
	select {
	case <-s.done:
		return fmt.Errorf("resuming %s: %w", s.id, isolation.ErrNotFound)
	default:
	}
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if s.paused {
		s.paused = false
		close(s.thawed)
	}
	return nil
}

// Paused reports whether the sandbox is paused, and how many times it was
// paused in all.
func (s *Sandbox) Paused() (bool, int) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	return s.paused, s.pauses
}

// frozen returns a channel that is closed when the sandbox is not paused.
func (s *Sandbox) frozen() <-chan struct{} {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if s.paused {
		return s.thawed
	}
	return nil
}

func newSandbox(spec isolation.Spec, interval time.Duration, linger bool, h *Host) *Sandbox {
	s := &Sandbox{
		linger: linger,
		id:     spec.ID,
		spec:   spec,
		host:   h,
		start:  time.Now(),
		ln:     newPipeListener(),
		done:   make(chan struct{}),
	}
	s.srv = &http.Server{Handler: s.agentHandler(interval)}
	s.srvWG.Go(func() { s.srv.Serve(s.ln) })
	return s
}

// ID implements isolation.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// Spec returns the spec the sandbox was created with.
func (s *Sandbox) Spec() isolation.Spec { return s.spec }

// DialAgent implements isolation.Sandbox.
func (s *Sandbox) DialAgent(ctx context.Context) (net.Conn, error) {
	select {
	case <-s.done:
		return nil, fmt.Errorf("dialing agent of %s: %w", s.id, isolation.ErrNotFound)
	default:
	}
	if p, _ := s.Paused(); p {
		return nil, fmt.Errorf("dialing agent of %s: %w", s.id, isolation.ErrPaused)
	}
	s.dials.Add(1)
	return s.ln.dial(ctx)
}

// Dials reports how many connections DialAgent has made to the agent.
func (s *Sandbox) Dials() int64 { return s.dials.Load() }

// Stats implements isolation.Sandbox with made-up, plausible numbers.
func (s *Sandbox) Stats(ctx context.Context) (isolation.Stats, error) {
	select {
	case <-s.done:
		return isolation.Stats{}, fmt.Errorf("reading stats of %s: %w", s.id, isolation.ErrNotFound)
	default:
	}
	memLimit := s.spec.Limits.MemoryBytes
	if memLimit == 0 {
		memLimit = 512 << 20
	}
	diskLimit := s.spec.Limits.DiskBytes
	if diskLimit == 0 {
		diskLimit = 1 << 30
	}
	return isolation.Stats{
		CPUUsage:    time.Since(s.start) / 100,
		MemoryBytes: 16 << 20,
		MemoryLimit: memLimit,
		DiskBytes:   4 << 20,
		DiskLimit:   diskLimit,
		Pids:        1,
	}, nil
}

// Kill implements isolation.Sandbox.
func (s *Sandbox) Kill(ctx context.Context) error {
	s.stop()
	s.host.mu.Lock()
	if s.host.sandboxes[s.id] == s {
		delete(s.host.sandboxes, s.id)
	}
	s.host.mu.Unlock()
	return nil
}

// Crash simulates the agent dying on its own: Done closes and connections
// drop, but nothing called Kill.
func (s *Sandbox) Crash() { s.Kill(context.Background()) }

func (s *Sandbox) stop() {
	s.once.Do(func() {
		close(s.done)
		if s.link != nil {
			s.link.Close()
			s.netns.Close()
		}
		if s.linger {
			s.ln.Close() // no new connections; open ones live on
			s.host.mu.Lock()
			s.host.lingering = append(s.host.lingering, s)
			s.host.mu.Unlock()
			return
		}
		s.srv.Close() // closes the listener and every connection
		s.srvWG.Wait()
	})
}

// Done implements isolation.Sandbox.
func (s *Sandbox) Done() <-chan struct{} { return s.done }

// Echo is the body the fake agent answers for unknown routes.
type Echo struct {
	SandboxID string              `json:"sandboxID"`
	Method    string              `json:"method"`
	Path      string              `json:"path"`
	Query     string              `json:"query"`
	Header    map[string][]string `json:"header"`
	Body      string              `json:"body"`
}

func (s *Sandbox) agentHandler(interval time.Duration) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if s.healthHook != nil {
			s.healthHook()
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /process.Process/Start", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		w.Header().Set("Content-Type", "application/connect+json")
		w.WriteHeader(http.StatusOK)
		writeEnvelope(w, `{"event":{"start":{"pid":1}}}`)
		t := time.NewTicker(interval)
		defer t.Stop()
		done := s.done
		if s.linger {
			done = nil // the stream outlives Kill
		}
		for {
			select {
			case <-r.Context().Done():
				return
			case <-done:
				return
			case <-t.C:
				if th := s.frozen(); th != nil {
					// Paused: nothing runs until Resume.
					select {
					case <-th:
					case <-r.Context().Done():
						return
					case <-done:
						return
					}
				}
				if err := writeEnvelope(w, `{"event":{"keepalive":{}}}`); err != nil {
					return
				}
			}
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(Echo{
			SandboxID: s.id, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
			Header: r.Header, Body: string(body),
		})
	})
	return mux
}

func writeEnvelope(w http.ResponseWriter, msg string) error {
	var hdr [5]byte
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(msg)))
	if _, err := w.Write(append(hdr[:], msg...)); err != nil {
		return err
	}
	http.NewResponseController(w).Flush()
	return nil
}

// pipeListener is a net.Listener whose connections come from dial.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		client.Close()
		server.Close()
		return nil, fmt.Errorf("dialing fake agent: %w", net.ErrClosed)
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "fake-agent" }

// Network returns the fence the sandbox was created with (Spec.Network).
// Without Options.NetNS a fake sandbox has no network namespace and
// attaches nothing: its owner's fence is where its policy lives.
func (s *Sandbox) Network() isolation.Network { return s.spec.Network }

// attach attaches the sandbox's Network to a fresh network namespace.
func (s *Sandbox) attach(ctx context.Context) error {
	ns, err := netfence.NewNetNS()
	if err != nil {
		return err
	}
	l, err := s.spec.Network.Attach(ctx, s.id, fmt.Sprintf("/proc/self/fd/%d", ns.Fd()), false)
	if err != nil {
		ns.Close()
		return err
	}
	s.netns, s.link = ns, l
	return nil
}
