package startup

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"
)

// readyTimeout bounds how long WaitPorts waits for a template's ready
// ports; readyPoll is the pause between attempts.
const (
	readyTimeout = 60 * time.Second
	readyPoll    = 20 * time.Millisecond
)

// WaitPorts waits until every port of sandbox id accepts a TCP connection
// made with dial (through the sandbox's fence, as the daemon's proxy will
// connect). It returns an error only when ctx ends; a port that is not
// open after readyTimeout is logged and the sandbox is handed out as it
// is (its other services work; requests to the port get the proxy's
// "port is not open").
func WaitPorts(ctx context.Context, log *slog.Logger, id string, dial func(context.Context, uint16) (net.Conn, error), template string, ports []uint16) error {
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
				log.WarnContext(ctx, "template port not open in time", "sandbox_id", id,
					"template", template, "port", port, "waited", time.Since(start), "err", err)
				return nil
			case <-time.After(readyPoll):
			}
		}
	}
	log.DebugContext(ctx, "template ports open", "sandbox_id", id, "template", template,
		"ports", ports, "waited", time.Since(start))
	return nil
}
