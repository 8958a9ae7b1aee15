// Package process implements envd's process.Process Connect service: it
// starts commands (with pipes or a PTY) as the request's user, streams
// their output to any number of clients, and takes input and signals.
//
// # Guarantees
//
//   - The start event is the first message of every Start and Connect
//     stream and is sent at once; the end event is the last.
//   - Output fans out to every connected stream through bounded queues: a
//     client that reads promptly gets every byte; a stalled one holds the
//     process back for at most a stall timeout, then its stream is dropped
//     with a data_loss error. Memory per stream is bounded, and all queued
//     output of the agent (pipes and PTYs) together stays within one
//     budget (Options.OutputBudget): past it the agent stops reading and
//     the processes block on write. Nothing is dropped without an error.
//   - A process's output is read to the end after it exits; the drain
//     grace only bounds the wait for more once its pipes are empty (a
//     background child holding them open).
//   - Processes outlive their streams (background commands). A deadline on
//     Start (Connect-Timeout-Ms) kills the process group when it passes.
//     A finished process stays visible to Connect for the retention time.
//   - Each process leads its own session; a signal goes to its process group
//     and to every other process of its session (jobs in groups of their
//     own), so killing a command leaves nothing it started running.
//   - A Start of /bin/bash in a sandbox without bash runs /bin/sh with the
//     same arguments (the SDKs always ask for bash; busybox templates lack it).
//   - The agent's reaper alone reaps children, including orphans
//     reparented to the agent as PID 1: on Linux 6.15 and later the kernel
//     reaps them at their exit and a process started here has its status
//     read from its pidfd, in the poller; elsewhere one goroutine on
//     SIGCHLD (wait4), and, for a process started here, the goroutine that
//     publishes its end as soon as its pidfd reports the exit; both under
//     one lock, each child once. Nothing else may wait for children in the
//     agent's process.
//   - A child gets exactly three descriptors (0-2), blocking; everything
//     the agent opens is close-on-exec.
package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/api/envd/process/processconnect"
	"github.com/fencesandbox/fence/internal/agent/users"
)

// DefaultPath is the PATH of every process unless overridden by env vars.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

const defaultKeepalive = 90 * time.Second

// sdkShell is the shell the SDKs start commands with; fallbackShell
// replaces it where it is missing.
const (
	sdkShell      = "/bin/bash"
	fallbackShell = "/bin/sh"
)

// Options configures a Service. Zero values are the documented defaults.
type Options struct {
	Users   *users.Resolver   // required
	EnvVars map[string]string // sandbox-global env vars, applied after the defaults
	Logger  *slog.Logger      // nil = discard
	// Retention is how long a finished process stays connectable (30 s).
	Retention time.Duration
	// Stall is how long a full stream queue may hold a process back before
	// that stream is dropped (30 s).
	Stall time.Duration
	// DrainGrace is how long output is awaited after the process exited,
	// while something else (a background child) holds its pipes (500 ms).
	DrainGrace time.Duration
	// OutputBudget is the bytes of output (pipes and PTYs) the agent holds
	// at once for all its streams (DefaultOutputBudget). Past it, the
	// agent stops reading until streams have sent what they hold.
	OutputBudget int64
	// IdleThreads, when above zero, is how many OS threads the agent
	// keeps once no process it started has run for a second: the Go
	// runtime's threads beyond it are ended then (TrimThreads).
	IdleThreads int
}

// Service is the process.Process handler.
type Service struct {
	opts   Options
	log    *slog.Logger
	reaper *reaper
	budget *budget
	// euid and egid are the agent's: a child of another user gets
	// credentials.
	euid, egid uint32

	mu    sync.Mutex
	procs map[int]*proc
	// finished are the ended processes still in procs, oldest end first:
	// each is forgotten by the first call that finds its retention over
	// (prune), without a timer per process.
	finished []finished
	running  int // processes started and not yet ended
	// trim trims the threads trimAfter after the last process's end
	// (ended); nil until the first.
	trim    *time.Timer
	trims   atomic.Int64 // trims made (trimIfIdle)
	closed  bool
	envVars map[string]string // sandbox-global; from Options, replaced by SetEnvVars
	// held, while open, keeps every fork waiting (HoldForks).
	held <-chan struct{}
}

// HoldForks makes every process start wait until ready is closed: the
// agent answers requests while the rest of its start (its signal
// handling, sudo) completes, and nothing of the sandbox runs before it.
// Call it before the service is used.
func (s *Service) HoldForks(ready <-chan struct{}) {
	s.mu.Lock()
	s.held = ready
	s.mu.Unlock()
}

// waitForks waits until forks are no longer held.
func (s *Service) waitForks() {
	s.mu.Lock()
	held := s.held
	s.mu.Unlock()
	if held != nil {
		<-held
	}
}

// SetEnvVars replaces the sandbox-global environment variables for the
// processes started from now on (the agent's /init).
func (s *Service) SetEnvVars(env map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.envVars = maps.Clone(env)
}

// GlobalEnv returns the sandbox-global environment variables.
func (s *Service) GlobalEnv() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.envVars
}

var _ processconnect.ProcessHandler = (*Service)(nil)

// NewService returns a Service; Close kills the processes it started.
func NewService(opts Options) *Service {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Retention == 0 {
		opts.Retention = 30 * time.Second
	}
	if opts.Stall == 0 {
		opts.Stall = 30 * time.Second
	}
	if opts.DrainGrace == 0 {
		opts.DrainGrace = 500 * time.Millisecond
	}
	if opts.OutputBudget <= 0 {
		opts.OutputBudget = DefaultOutputBudget
	}
	return &Service{opts: opts, log: opts.Logger, reaper: getReaper(), budget: newBudget(opts.OutputBudget),
		procs: make(map[int]*proc), envVars: maps.Clone(opts.EnvVars),
		euid: uint32(os.Geteuid()), egid: uint32(os.Getegid())}
}

// Warm does now what the first process start would otherwise do for
// itself: it reads the agent's OOM score (see oomScores). Call it only
// once the sandbox's setup is done (the agent serves its sandbox), never
// from a process waiting for one.
func (s *Service) Warm() { s.reaper.oom.learn() }

// Handler returns the Connect route prefix and handler.
func (s *Service) Handler(opts ...connect.HandlerOption) (string, http.Handler) {
	path, h := processconnect.NewProcessHandler(s, opts...)
	return path, withFlushGate(h)
}

// Close kills (SIGKILL, whole process group) every running process the
// Service started and refuses new ones.
func (s *Service) Close() {
	s.mu.Lock()
	s.closed = true
	procs := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		if p.running() {
			_ = p.signal(unix.SIGKILL)
		}
	}
}

// dropStalled drops every stream that holds output and has not taken any
// for the stall time, giving its bytes back to the budget: called by a
// reader that has waited that long for the budget.
func (s *Service) dropStalled() {
	s.mu.Lock()
	procs := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		p.mu.Lock()
		subs := make([]*subscriber, 0, len(p.subs))
		for sub := range p.subs {
			subs = append(subs, sub)
		}
		p.mu.Unlock()
		for _, sub := range subs {
			sub.dropIfStalled(s.opts.Stall)
		}
	}
}

// OutputHeld returns the bytes of process output the agent holds now.
func (s *Service) OutputHeld() int64 { return s.budget.used() }

// finished is an ended process and when its retention is over.
type finished struct {
	p     *proc
	until time.Time
}

// pruneLocked forgets the processes whose retention is over.
func (s *Service) pruneLocked(now time.Time) {
	n := 0
	for _, f := range s.finished {
		if now.Before(f.until) {
			break
		}
		if s.procs[f.p.pid] == f.p {
			delete(s.procs, f.p.pid)
		}
		n++
	}
	if n > 0 {
		clear(s.finished[:n])
		s.finished = s.finished[n:]
	}
}

func (s *Service) lookup(sel *pb.ProcessSelector) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(time.Now())
	switch v := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := s.procs[int(v.Pid)]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", v.Pid))
	case *pb.ProcessSelector_Tag:
		for _, p := range s.procs {
			if p.info.Tag != nil && *p.info.Tag == v.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", v.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector is required"))
}

// Start starts a process and streams its events.
func (s *Service) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	u, err := s.opts.Users.FromHeader(req.Header())
	if err != nil {
		return connect.NewError(connect.CodeUnauthenticated, err)
	}
	p, sub, err := s.start(u, req.Msg)
	if err != nil {
		return err
	}
	defer p.unsubscribe(sub)
	if dl, ok := ctx.Deadline(); ok {
		p.killAt(dl)
	}
	start := &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(p.pid)}}}
	if err := stream.Send(&pb.StartResponse{Event: start}); err != nil {
		return err
	}
	return pump(ctx, keepaliveInterval(req.Header()), sub, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
}

// Connect streams the events of a running (or recently finished) process.
func (s *Service) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := s.lookup(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub := p.subscribe()
	defer p.unsubscribe(sub)
	start := &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(p.pid)}}}
	if err := stream.Send(&pb.ConnectResponse{Event: start}); err != nil {
		return err
	}
	return pump(ctx, keepaliveInterval(req.Header()), sub, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
}

// keepaliveInterval reads Keepalive-Ping-Interval (seconds), 90 s if
// absent or bad.
func keepaliveInterval(h http.Header) time.Duration {
	if v := h.Get("Keepalive-Ping-Interval"); v != "" {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
			return time.Duration(n) * time.Second
		}
	}
	return defaultKeepalive
}

// pump sends sub's events until the end event, sending a keepalive after
// every interval of silence.
func pump(ctx context.Context, interval time.Duration, sub *subscriber, send func(*pb.ProcessEvent) error) error {
	keepalive := &pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}
	t := time.NewTimer(interval)
	defer t.Stop()
	dl, hasDeadline := ctx.Deadline()
	for {
		items, dropped := sub.take()
		err := ctx.Err()
		if err == nil && hasDeadline && !time.Now().Before(dl) {
			// Past the deadline, whose timer has not fired yet: the end
			// event in may be of the process killAt killed at it.
			err = context.DeadlineExceeded
		}
		if err != nil {
			// The deadline (or the client) ended the call: that is its
			// outcome, even if the end event of the process the deadline
			// killed is already in (the caller gets deadline_exceeded,
			// whichever of the two wakes this loop first).
			for _, it := range items {
				sub.b.release(int64(it.n))
			}
			return err
		}
		for i, it := range items {
			if it.ev.GetEnd() != nil {
				// The last message: the handler returns right after it.
				holdFlushes(ctx)
			}
			err := send(it.ev)
			sub.b.release(int64(it.n))
			if err != nil || it.ev.GetEnd() != nil {
				for _, rest := range items[i+1:] {
					sub.b.release(int64(rest.n))
				}
				return err
			}
		}
		if dropped {
			return connect.NewError(connect.CodeDataLoss, errors.New("output dropped: the client did not keep up"))
		}
		if len(items) > 0 {
			t.Reset(interval)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sub.notify:
		case <-t.C:
			if err := send(keepalive); err != nil {
				return err
			}
			t.Reset(interval)
		}
	}
}

// List returns the running processes.
func (s *Service) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	s.mu.Lock()
	res := &pb.ListResponse{}
	for _, p := range s.procs {
		if p.running() {
			res.Processes = append(res.Processes, p.info)
		}
	}
	s.mu.Unlock()
	sort.Slice(res.Processes, func(i, j int) bool { return res.Processes[i].Pid < res.Processes[j].Pid })
	return connect.NewResponse(res), nil
}

// SendInput writes to the process's stdin or PTY.
func (s *Service) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var data []byte
	switch in := req.Msg.GetInput().GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		data = in.Stdin
	case *pb.ProcessInput_Pty:
		data = in.Pty
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input is required"))
	}
	if err := p.write(ctx, data); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (p *proc) write(ctx context.Context, data []byte) error {
	if p.master != nil {
		if _, err := p.master.Write(data); err != nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("writing to pty: %w", err))
		}
		return nil
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("stdin is not open for this process"))
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = p.stdin.SetWriteDeadline(dl)
		defer p.stdin.SetWriteDeadline(time.Time{})
	}
	if _, err := p.stdin.Write(data); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("writing to stdin: %w", err))
	}
	return nil
}

// StreamInput is not used by the SDKs.
func (s *Service) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("StreamInput is not supported; use SendInput"))
}

// CloseStdin closes the process's stdin (EOF).
func (s *Service) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.master != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("cannot close stdin of a pty process; send Ctrl+D (0x04) instead"))
	}
	p.stdinMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.stdinMu.Unlock()
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

// SendSignal signals the process group.
func (s *Service) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig unix.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = unix.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = unix.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %v", req.Msg.GetSignal()))
	}
	if err := p.signal(sig); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has exited", p.pid))
		}
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("signalling process %d: %w", p.pid, err))
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// Update resizes the process's PTY.
func (s *Service) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		if p.master == nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no pty", p.pid))
		}
		if err := setSize(p.master, size.GetCols(), size.GetRows()); err != nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("resizing pty: %w", err))
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}
