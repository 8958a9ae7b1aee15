package mcp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"connectrpc.com/connect"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fencesandbox/fence/client"
)

// RunInput is run_command's input.
type RunInput struct {
	SandboxID      string            `json:"sandbox_id" jsonschema:"the sandbox's ID"`
	Command        string            `json:"command" jsonschema:"the shell command, run with sh -c"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory (default: the user's home)"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables of this command only"`
	User           string            `json:"user,omitempty" jsonschema:"user to run as (default: the template's, usually user)"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty" jsonschema:"seconds before the command is killed (default 60)"`
}

// RunOutput is run_command's answer.
type RunOutput struct {
	ExitCode int    `json:"exit_code" jsonschema:"the exit code, or 128+n when signal n ended the command"`
	Stdout   string `json:"stdout" jsonschema:"the end of the command's standard output"`
	Stderr   string `json:"stderr" jsonschema:"the end of the command's standard error"`
	// Truncated says that stdout or stderr lost its beginning.
	Truncated bool `json:"truncated,omitempty" jsonschema:"stdout or stderr was longer than returned; its beginning was dropped"`
	TimedOut  bool `json:"timed_out,omitempty" jsonschema:"the command was killed at its timeout"`
}

func (t *tools) run(ctx context.Context, req *sdk.CallToolRequest, in RunInput) (RunOutput, error) {
	if in.Command == "" {
		return RunOutput{}, inputErrorf("command is required")
	}
	timeout, err := seconds("timeout_seconds", in.TimeoutSeconds, DefaultCommandTimeout)
	if err != nil {
		return RunOutput{}, err
	}
	e, err := t.envd(ctx, in.SandboxID)
	if err != nil {
		return RunOutput{}, err
	}
	out := &streams{ctx: ctx, req: req}
	if req != nil && req.Params != nil {
		out.token = req.Params.GetProgressToken()
	}
	st, err := e.Run(ctx, client.ProcessSpec{
		Cmd: "/bin/sh", Args: []string{"-c", in.Command}, Cwd: in.Cwd, Env: in.Env, User: in.User,
		Timeout: timeout, Stdout: out.writer("stdout"), Stderr: out.writer("stderr"),
	})
	res := out.result()
	if err != nil {
		// The deadline is the client's or the agent's, whichever ends
		// the stream first.
		if ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || connect.CodeOf(err) == connect.CodeDeadlineExceeded) {
			res.TimedOut, res.ExitCode = true, 124
			return res, nil
		}
		return RunOutput{}, fmt.Errorf("running the command: %w", err)
	}
	res.ExitCode = st.Code()
	return res, nil
}

// streams keeps the end of a command's output and streams it as progress
// notifications when the call carried a progress token. The client writes
// both streams from one goroutine; the mutex keeps result safe anyway.
type streams struct {
	ctx   context.Context
	req   *sdk.CallToolRequest
	token any

	mu             sync.Mutex
	total          int64
	stdout, stderr tail
}

func (s *streams) writer(name string) writerFunc {
	return func(p []byte) (int, error) {
		s.mu.Lock()
		t := &s.stdout
		if name == "stderr" {
			t = &s.stderr
		}
		t.write(p)
		s.total += int64(len(p))
		total := s.total
		s.mu.Unlock()
		if s.token != nil && s.req.Session != nil {
			// A lost notification loses nothing of the result.
			_ = s.req.Session.NotifyProgress(s.ctx, &sdk.ProgressNotificationParams{
				ProgressToken: s.token, Progress: float64(total), Message: string(p),
				Meta: sdk.Meta{"stream": name},
			})
		}
		return len(p), nil
	}
}

func (s *streams) result() RunOutput {
	s.mu.Lock()
	defer s.mu.Unlock()
	return RunOutput{Stdout: string(s.stdout.b), Stderr: string(s.stderr.b), Truncated: s.stdout.cut || s.stderr.cut}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// tail keeps the last OutputCap bytes written to it.
type tail struct {
	b   []byte
	cut bool
}

func (t *tail) write(p []byte) {
	t.b = append(t.b, p...)
	if n := len(t.b) - OutputCap; n > 0 {
		t.b = append(t.b[:0], t.b[n:]...)
		t.cut = true
	}
}
