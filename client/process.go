package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencesandbox/fence/api/envd/process"
)

// PTYSize is a terminal size in character cells.
type PTYSize struct {
	Cols, Rows uint16
}

// ProcessSpec describes a process to start in a sandbox.
type ProcessSpec struct {
	Cmd  string   // program; resolved by the agent through PATH
	Args []string // arguments after Cmd
	// Env is added to the sandbox's environment for this process only.
	Env map[string]string
	// Cwd is the working directory; "" means the user's default.
	Cwd string
	// User runs the process as this user; "" means the Envd's user, or the
	// agent's default user.
	User string
	// PTY, when set, runs the process on a terminal of that size. Its
	// output arrives on Stdout and its input goes through SendStdin.
	PTY *PTYSize
	// Stdin keeps the process's standard input open for SendStdin and
	// CloseStdin. When false (and without PTY) the process reads EOF.
	Stdin bool
	// Tag names the process in ListProcesses.
	Tag string
	// Timeout, when above zero, is sent to the agent as the stream's
	// deadline (Connect-Timeout-Ms); the agent kills the process when it
	// elapses. Zero means no limit beyond ctx's deadline.
	Timeout time.Duration
	// Stdout and Stderr receive the process's output; nil discards it.
	// They are written from one goroutine, in order.
	Stdout, Stderr io.Writer
}

// ExitStatus is how a process ended, as the agent reported it.
type ExitStatus struct {
	ExitCode int    // exit code; -1 or 0 when killed by a signal
	Exited   bool   // the process exited by itself (not by a signal)
	Status   string // e.g. "exit status 1", "signal: killed"
	Error    string // agent-side error, if any
}

// Signal returns the signal that ended the process, from Status.
func (s ExitStatus) Signal() (syscall.Signal, bool) {
	name, ok := strings.CutPrefix(s.Status, "signal: ")
	if !ok {
		return 0, false
	}
	name = strings.TrimSuffix(name, " (core dumped)")
	for n := syscall.Signal(1); n < 65; n++ {
		if n.String() == name {
			return n, true
		}
	}
	return 0, false
}

// Code is the exit code a shell would report: the exit code, or 128 plus the
// number of the signal that ended the process.
func (s ExitStatus) Code() int {
	if sig, ok := s.Signal(); ok {
		return 128 + int(sig)
	}
	if s.ExitCode < 0 || s.ExitCode > 255 {
		return 255
	}
	return s.ExitCode
}

// Process is a process running in a sandbox, started by Start or attached to
// by ConnectProcess.
type Process struct {
	// PID is the process ID inside the sandbox.
	PID uint32

	e      *Envd
	user   string
	pty    atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
	status ExitStatus // valid after done
	err    error      // valid after done
}

// Start starts a process and returns once the agent reported its PID. The
// process's output is delivered until it ends, ctx is cancelled or Close is
// called. A deadline on ctx is passed to the agent, which kills the process
// when it elapses (as it does for spec.Timeout).
func (e *Envd) Start(ctx context.Context, spec ProcessSpec) (*Process, error) {
	cfg := &process.ProcessConfig{Cmd: spec.Cmd, Args: spec.Args, Envs: spec.Env}
	if spec.Cwd != "" {
		cfg.Cwd = &spec.Cwd
	}
	stdin := spec.Stdin
	req := &process.StartRequest{Process: cfg, Stdin: &stdin}
	if spec.Tag != "" {
		req.Tag = &spec.Tag
	}
	if spec.PTY != nil {
		req.Pty = &process.PTY{Size: &process.PTY_Size{Cols: uint32(spec.PTY.Cols), Rows: uint32(spec.PTY.Rows)}}
	}
	var sctx context.Context
	var cancel context.CancelFunc
	if spec.Timeout > 0 {
		sctx, cancel = context.WithTimeout(ctx, spec.Timeout)
	} else {
		sctx, cancel = context.WithCancel(ctx)
	}
	r := request(e, req, spec.User)
	r.Header().Set("Keepalive-Ping-Interval", keepalivePingInterval)
	stream, err := e.proc.Start(sctx, r)
	if err != nil {
		cancel()
		return nil, wrapRPC("starting process", err)
	}
	next := func() (*process.ProcessEvent, error) {
		if !stream.Receive() {
			if err := stream.Err(); err != nil {
				return nil, err
			}
			return nil, io.EOF
		}
		return stream.Msg().GetEvent(), nil
	}
	user := spec.User
	if user == "" {
		user = e.user
	}
	p, err := e.attach(next, stream.Close, cancel, user, spec.Stdout, spec.Stderr)
	if err != nil {
		return nil, fmt.Errorf("starting process: %w", err)
	}
	p.pty.Store(spec.PTY != nil)
	return p, nil
}

// Run starts a process and waits for it to end.
func (e *Envd) Run(ctx context.Context, spec ProcessSpec) (ExitStatus, error) {
	p, err := e.Start(ctx, spec)
	if err != nil {
		return ExitStatus{}, err
	}
	return p.Wait()
}

// ConnectProcess attaches to a running process by PID and delivers its
// further output to stdout and stderr (nil discards).
func (e *Envd) ConnectProcess(ctx context.Context, pid uint32, stdout, stderr io.Writer) (*Process, error) {
	sctx, cancel := context.WithCancel(ctx)
	req := &process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}}
	r := request(e, req, "")
	r.Header().Del("Authorization") // the SDKs send no user on Connect
	r.Header().Set("Keepalive-Ping-Interval", keepalivePingInterval)
	stream, err := e.proc.Connect(sctx, r)
	if err != nil {
		cancel()
		return nil, wrapRPC(fmt.Sprintf("connecting to process %d", pid), err)
	}
	next := func() (*process.ProcessEvent, error) {
		if !stream.Receive() {
			if err := stream.Err(); err != nil {
				return nil, err
			}
			return nil, io.EOF
		}
		return stream.Msg().GetEvent(), nil
	}
	p, err := e.attach(next, stream.Close, cancel, e.user, stdout, stderr)
	if err != nil {
		return nil, fmt.Errorf("connecting to process %d: %w", pid, err)
	}
	return p, nil
}

// errNoStart is returned when a process stream does not begin with a start
// event.
var errNoStart = errors.New("process stream did not begin with a start event")

// attach reads the start event from a process stream and starts the
// goroutine that delivers the rest.
func (e *Envd) attach(next func() (*process.ProcessEvent, error), closeStream func() error, cancel context.CancelFunc, user string, stdout, stderr io.Writer) (*Process, error) {
	ev, err := next()
	if err != nil || ev.GetStart() == nil {
		closeStream()
		cancel()
		if err == nil || err == io.EOF {
			return nil, errNoStart
		}
		return nil, classify(err)
	}
	p := &Process{
		PID:    ev.GetStart().GetPid(),
		e:      e,
		user:   user,
		cancel: cancel,
		done:   make(chan struct{}),
	}
	go p.deliver(next, closeStream, orDiscard(stdout), orDiscard(stderr))
	return p, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// deliver writes output events until the stream ends, then records the exit.
// Output write errors do not stop the stream: the process must not block on
// a reader that went away.
func (p *Process) deliver(next func() (*process.ProcessEvent, error), closeStream func() error, stdout, stderr io.Writer) {
	defer close(p.done)
	defer p.cancel()
	defer closeStream()
	gotEnd := false
	for {
		ev, err := next()
		if err != nil {
			switch {
			case gotEnd:
			case err == io.EOF:
				p.err = errors.New("process stream ended without an exit status")
			default:
				p.err = wrapRPC("reading process output", err)
			}
			return
		}
		switch {
		case ev.GetData() != nil:
			d := ev.GetData()
			switch o := d.GetOutput().(type) {
			case *process.ProcessEvent_DataEvent_Stdout:
				stdout.Write(o.Stdout)
			case *process.ProcessEvent_DataEvent_Stderr:
				stderr.Write(o.Stderr)
			case *process.ProcessEvent_DataEvent_Pty:
				p.pty.Store(true)
				stdout.Write(o.Pty)
			}
		case ev.GetEnd() != nil:
			end := ev.GetEnd()
			p.status = ExitStatus{
				ExitCode: int(end.GetExitCode()),
				Exited:   end.GetExited(),
				Status:   end.GetStatus(),
				Error:    end.GetError(),
			}
			gotEnd = true
		}
	}
}

// Wait waits until the process ended and its output was delivered, and
// returns how it ended. A non-zero exit is not an error; an error means the
// stream broke (sandbox killed, ctx cancelled, Close) before the agent
// reported the exit.
func (p *Process) Wait() (ExitStatus, error) {
	<-p.done
	return p.status, p.err
}

// Done is closed when Wait would not block.
func (p *Process) Done() <-chan struct{} { return p.done }

// Close stops receiving the process's output without affecting the process,
// which keeps running in the sandbox, and waits until delivery stopped.
func (p *Process) Close() error {
	p.cancel()
	<-p.done
	return nil
}

func (p *Process) selector() *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: p.PID}}
}

// SendStdin writes data to the process's standard input (its terminal for a
// PTY process).
func (p *Process) SendStdin(ctx context.Context, data []byte) error {
	in := &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: data}}
	if p.pty.Load() {
		in.Input = &process.ProcessInput_Pty{Pty: data}
	}
	_, err := p.e.proc.SendInput(ctx, request(p.e, &process.SendInputRequest{Process: p.selector(), Input: in}, p.user))
	return wrapRPC("sending stdin", err)
}

// CloseStdin closes the process's standard input (not for PTY processes;
// send Ctrl-D, 0x04, instead).
func (p *Process) CloseStdin(ctx context.Context) error {
	_, err := p.e.proc.CloseStdin(ctx, request(p.e, &process.CloseStdinRequest{Process: p.selector()}, p.user))
	return wrapRPC("closing stdin", err)
}

// Signal sends sig to the process. envd's protocol names SIGTERM and SIGKILL;
// other signals are sent by number and the agent may refuse them.
func (p *Process) Signal(ctx context.Context, sig syscall.Signal) error {
	req := &process.SendSignalRequest{Process: p.selector(), Signal: process.Signal(sig)}
	_, err := p.e.proc.SendSignal(ctx, request(p.e, req, p.user))
	return wrapRPC(fmt.Sprintf("sending signal %d", int(sig)), err)
}

// Resize changes the size of the process's terminal.
func (p *Process) Resize(ctx context.Context, size PTYSize) error {
	req := &process.UpdateRequest{
		Process: p.selector(),
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: uint32(size.Cols), Rows: uint32(size.Rows)}},
	}
	_, err := p.e.proc.Update(ctx, request(p.e, req, p.user))
	return wrapRPC("resizing terminal", err)
}

// ProcessInfo describes a process the agent runs.
type ProcessInfo struct {
	PID  uint32
	Tag  string
	Cmd  string
	Args []string
	Env  map[string]string
	Cwd  string
}

// ListProcesses lists the processes the agent started and still runs.
func (e *Envd) ListProcesses(ctx context.Context) ([]ProcessInfo, error) {
	resp, err := e.proc.List(ctx, request(e, &process.ListRequest{}, ""))
	if err != nil {
		return nil, wrapRPC("listing processes", err)
	}
	var out []ProcessInfo
	for _, pi := range resp.Msg.GetProcesses() {
		c := pi.GetConfig()
		out = append(out, ProcessInfo{
			PID: pi.GetPid(), Tag: pi.GetTag(),
			Cmd: c.GetCmd(), Args: c.GetArgs(), Env: c.GetEnvs(), Cwd: c.GetCwd(),
		})
	}
	return out, nil
}
