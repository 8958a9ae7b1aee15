package startup

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
)

// dialBox is a sandbox whose port opens after a number of refused dials.
type dialBox struct {
	isolation.Sandbox
	refuse int32
	dials  atomic.Int32
}

func (b *dialBox) ID() string { return "dialbox" }

func (b *dialBox) DialPort(ctx context.Context, port uint16) (net.Conn, error) {
	if b.dials.Add(1) <= b.refuse {
		return nil, errors.New("connection refused")
	}
	c1, c2 := net.Pipe()
	c2.Close()
	return c1, nil
}

func TestWaitPortsWaitsForThePort(t *testing.T) {
	box := &dialBox{refuse: 5}
	if err := WaitPorts(t.Context(), slog.New(slog.DiscardHandler), box.ID(), box.DialPort, "code-interpreter", []uint16{49999}); err != nil {
		t.Fatalf("WaitPorts = %v", err)
	}
	if n := box.dials.Load(); n != 6 {
		t.Errorf("dials = %d, want 6 (5 refused, then open)", n)
	}
}

func TestWaitPortsEndsWithTheContext(t *testing.T) {
	box := &dialBox{refuse: 1 << 30}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err := WaitPorts(ctx, slog.New(slog.DiscardHandler), box.ID(), box.DialPort, "code-interpreter", []uint16{49999})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitPorts with an ending ctx = %v, want DeadlineExceeded", err)
	}
}

func TestWaitPortsWithoutPorts(t *testing.T) {
	box := &dialBox{refuse: 1 << 30}
	if err := WaitPorts(t.Context(), slog.New(slog.DiscardHandler), box.ID(), box.DialPort, "base", nil); err != nil || box.dials.Load() != 0 {
		t.Errorf("WaitPorts(no ports) = %v after %d dials, want nil at once", err, box.dials.Load())
	}
}
