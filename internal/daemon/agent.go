package daemon

import (
	"context"
	"net"
	"net/http"

	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox/startup"
)

// envdAgent is a sandbox's agent as the sandbox manager runs template
// commands in it (startup.Agent): the envd client over the sandbox's own
// connection to its agent, which the backend dials.
type envdAgent struct {
	tr   *http.Transport
	envd *client.Envd
}

var _ startup.Connect = connectAgent

// connectAgent returns the agent of box.
func connectAgent(box isolation.Sandbox) startup.Agent {
	tr := &http.Transport{
		DialContext:        func(ctx context.Context, _, _ string) (net.Conn, error) { return box.DialAgent(ctx) },
		DisableCompression: true,
	}
	return envdAgent{tr: tr, envd: client.NewEnvd(&http.Client{Transport: tr}, "http://agent", nil)}
}

func (a envdAgent) Start(ctx context.Context, c startup.Command) (startup.Proc, error) {
	p, err := a.envd.Start(ctx, client.ProcessSpec{Cmd: "/bin/bash", Args: []string{"-l", "-c", c.Cmd},
		User: c.User, Cwd: c.Cwd, Tag: c.Tag})
	if err != nil {
		return nil, err
	}
	return envdProc{p}, nil
}

func (a envdAgent) Tagged(ctx context.Context, tag string) (bool, error) {
	ps, err := a.envd.ListProcesses(ctx)
	if err != nil {
		return false, err
	}
	for _, p := range ps {
		if p.Tag == tag {
			return true, nil
		}
	}
	return false, nil
}

func (a envdAgent) Close() { a.tr.CloseIdleConnections() }

// envdProc is a process the envd client started, as startup.Proc.
type envdProc struct{ p *client.Process }

func (p envdProc) Done() <-chan struct{} { return p.p.Done() }
func (p envdProc) Close()                { p.p.Close() }

func (p envdProc) Wait() (startup.Exit, error) {
	st, err := p.p.Wait()
	return startup.Exit{Exited: st.Exited, Code: st.ExitCode}, err
}
