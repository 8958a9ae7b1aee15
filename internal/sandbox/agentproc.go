package sandbox

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"

	"connectrpc.com/connect"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/api/envd/process/processconnect"
	"github.com/fencesandbox/fence/internal/isolation"
)

// agentProcs runs a template's commands in a sandbox through its agent's
// process service (the envd protocol), over the sandbox's own connection
// to the agent. Errors of the protocol carry the api sentinel for their
// code (api.RPCError).
type agentProcs struct {
	tr *http.Transport
	pc processconnect.ProcessClient
}

func newAgentProcs(box isolation.Sandbox) *agentProcs {
	tr := &http.Transport{
		DialContext:        func(ctx context.Context, _, _ string) (net.Conn, error) { return box.DialAgent(ctx) },
		DisableCompression: true,
	}
	return &agentProcs{tr: tr,
		pc: processconnect.NewProcessClient(&http.Client{Transport: tr}, "http://agent", connect.WithProtoJSON())}
}

// close drops the idle connections to the agent; processes started run on.
func (a *agentProcs) close() { a.tr.CloseIdleConnections() }

// exitStatus is how a process ended.
type exitStatus struct {
	exited bool // it exited (rather than being killed by a signal)
	code   int
}

// agentProc is a process started by agentProcs.start, followed until it
// ends, its context is cancelled or close is called.
type agentProc struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when following stopped
	status exitStatus    // valid after done, if err is nil
	err    error         // the stream broke before the agent reported the end
}

// shellCommand is a Runtime command as the agent starts it: bash -l -c,
// as user (the agent's default when ""), in cwd (the default when "").
func shellCommand(cmd, user, cwd, tag string) *connect.Request[process.StartRequest] {
	stdin := false
	req := &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}},
		Stdin: &stdin}
	if cwd != "" {
		req.Process.Cwd = &cwd
	}
	if tag != "" {
		req.Tag = &tag
	}
	r := connect.NewRequest(req)
	if user != "" {
		// envd reads the user from Basic auth with an empty password.
		r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	// The agent keeps a quiet stream alive with pings this often (seconds).
	r.Header().Set("Keepalive-Ping-Interval", "50")
	return r
}

// start starts cmd (see shellCommand) and returns once the agent reported
// the process started.
func (a *agentProcs) start(ctx context.Context, cmd, user, cwd, tag string) (*agentProc, error) {
	sctx, cancel := context.WithCancel(ctx)
	stream, err := a.pc.Start(sctx, shellCommand(cmd, user, cwd, tag))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("starting process: %w", api.RPCError(uint32(connect.CodeOf(err)), err))
	}
	if !stream.Receive() || stream.Msg().GetEvent().GetStart() == nil {
		err := stream.Err()
		stream.Close()
		cancel()
		if err == nil {
			return nil, errors.New("starting process: process stream did not begin with a start event")
		}
		return nil, fmt.Errorf("starting process: %w", api.RPCError(uint32(connect.CodeOf(err)), err))
	}
	p := &agentProc{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer cancel()
		defer stream.Close()
		ended := false
		for stream.Receive() {
			if end := stream.Msg().GetEvent().GetEnd(); end != nil {
				p.status, ended = exitStatus{exited: end.GetExited(), code: int(end.GetExitCode())}, true
			}
		}
		switch err := stream.Err(); {
		case ended:
		case err == nil:
			p.err = errors.New("process stream ended without an exit status")
		default:
			p.err = fmt.Errorf("reading process output: %w", api.RPCError(uint32(connect.CodeOf(err)), err))
		}
	}()
	return p, nil
}

// run starts cmd (see shellCommand) and waits for it to end.
func (a *agentProcs) run(ctx context.Context, cmd, user, cwd string) (exitStatus, error) {
	p, err := a.start(ctx, cmd, user, cwd, "")
	if err != nil {
		return exitStatus{}, err
	}
	return p.wait()
}

// wait waits until p ended and returns how. A non-zero exit is not an
// error; an error means the stream broke first.
func (p *agentProc) wait() (exitStatus, error) {
	<-p.done
	return p.status, p.err
}

// close stops following p, which runs on in the sandbox.
func (p *agentProc) close() {
	p.cancel()
	<-p.done
}

// tagged reports whether a process tagged tag runs in the sandbox.
func (a *agentProcs) tagged(ctx context.Context, tag string) (bool, error) {
	resp, err := a.pc.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		return false, fmt.Errorf("listing processes: %w", api.RPCError(uint32(connect.CodeOf(err)), err))
	}
	for _, p := range resp.Msg.GetProcesses() {
		if p.GetTag() == tag {
			return true, nil
		}
	}
	return false, nil
}
