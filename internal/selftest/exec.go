package selftest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/fencesandbox/fence/client"
)

// AgentExec returns an Exec that runs commands as root through the agent
// that dial reaches (a sandbox's DialAgent), keeping at most 64 KiB of
// each output stream, and a function that releases its connections.
func AgentExec(dial func(context.Context) (net.Conn, error)) (Exec, func()) {
	tr := &http.Transport{
		DialContext:        func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		DisableCompression: true,
	}
	e := client.NewEnvd(&http.Client{Transport: tr}, "http://agent", nil)
	exec := func(ctx context.Context, argv []string) (Outcome, error) {
		var stdout, stderr capBuffer
		st, err := e.Run(ctx, client.ProcessSpec{
			Cmd: argv[0], Args: argv[1:], User: "root", Stdout: &stdout, Stderr: &stderr,
		})
		if err != nil {
			return Outcome{}, err
		}
		out := Outcome{Stdout: stdout.String(), Stderr: stderr.String(), ExitCode: st.ExitCode}
		if sig, ok := st.Signal(); ok {
			out.Signal = sig
		} else if !st.Exited && st.Error != "" {
			return out, fmt.Errorf("agent: %s", st.Error)
		}
		return out, nil
	}
	return exec, tr.CloseIdleConnections
}

// capBuffer keeps the first 64 KiB written to it.
type capBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *capBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := 64<<10 - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

func (b *capBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
