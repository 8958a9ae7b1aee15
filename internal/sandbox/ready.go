package sandbox

import (
	"context"
	"fmt"
	"net"
	"time"
)

// ReadyPorter is implemented by Templates that know which ports a sandbox
// of a template serves once started (the daemon's, over tbuild.Catalog:
// the code-interpreter template's server). Create waits for them.
type ReadyPorter interface {
	ReadyPorts(name string) []uint16
}

// readyTimeout bounds how long Create waits for a template's ready ports;
// readyPoll is the pause between attempts.
const (
	readyTimeout = 60 * time.Second
	readyPoll    = 20 * time.Millisecond
)

// waitReady waits until every port of sandbox id accepts a TCP connection
// made with dial (through the sandbox's fence, as the daemon's proxy will
// connect). It returns
// an error only when ctx ends; a port that is not open after readyTimeout
// is logged and the sandbox is handed out as it is (its other services
// work; requests to the port get the proxy's "port is not open").
func (m *Manager) waitReady(ctx context.Context, id string, dial func(context.Context, uint16) (net.Conn, error), template string, ports []uint16) error {
	if len(ports) == 0 {
		return nil
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for _, port := range ports {
		for {
			c, err := dial(wctx, port)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-wctx.Done():
				if ctx.Err() != nil {
					return fmt.Errorf("waiting for port %d of template %s: %w", port, template, ctx.Err())
				}
				m.log.WarnContext(ctx, "template port not open in time", "sandbox_id", id,
					"template", template, "port", port, "waited", time.Since(start), "err", err)
				return nil
			case <-time.After(readyPoll):
			}
		}
	}
	m.log.DebugContext(ctx, "template ports open", "sandbox_id", id, "template", template,
		"ports", ports, "waited", time.Since(start))
	return nil
}
