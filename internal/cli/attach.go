package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/fencesandbox/fence/client"
)

// session attaches the CLI's stdio to one process in a sandbox.
type session struct {
	in          io.Reader
	out, errOut io.Writer
	// tty runs the process on a terminal. When in is a terminal too, it is
	// put in raw mode and its size follows SIGWINCH.
	tty bool
	// stdin forwards in to the process.
	stdin bool
	// sigs delivers SIGINT/SIGTERM received by the CLI.
	sigs <-chan os.Signal
	// onSignal decides what a signal does: it returns true to stop
	// waiting (the session then returns 128+n).
	onSignal func(ctx context.Context, p *client.Process, sig syscall.Signal, n int) bool
}

// terminalFd returns the fd of r if it is a terminal, else -1.
func terminalFd(r io.Reader) int {
	if f, ok := r.(*os.File); ok && isTerminal(int(f.Fd())) {
		return int(f.Fd())
	}
	return -1
}

// run starts spec, pumps stdio until the process ends, and returns its exit
// code (shell style).
func (s *session) run(ctx context.Context, e *client.Envd, spec client.ProcessSpec) (int, error) {
	fd := terminalFd(s.in)
	var winch chan os.Signal
	if s.tty {
		size := client.PTYSize{Cols: 80, Rows: 24}
		if fd >= 0 {
			if sz, err := termSize(fd); err == nil && sz.Cols > 0 && sz.Rows > 0 {
				size = sz
			}
			old, err := makeRaw(fd)
			if err != nil {
				return 0, fmt.Errorf("setting terminal to raw mode: %w", err)
			}
			defer old.restore()
			winch = make(chan os.Signal, 1)
			signal.Notify(winch, syscall.SIGWINCH)
			defer signal.Stop(winch)
		}
		spec.PTY = &size
	}
	spec.Stdin = s.stdin && !s.tty
	spec.Stdout, spec.Stderr = s.out, s.errOut
	p, err := e.Start(ctx, spec)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	if s.stdin {
		// This goroutine ends at EOF or when sending fails (the process is
		// gone). A read that blocks on a terminal can outlive the session;
		// the CLI exits right after it, so that costs nothing.
		go s.pumpStdin(ctx, p)
	}
	n := 0
	for {
		select {
		case <-p.Done():
			st, err := p.Wait()
			if err != nil {
				return 0, err
			}
			return st.Code(), nil
		case <-winch:
			if sz, err := termSize(fd); err == nil {
				p.Resize(ctx, sz)
			}
		case sig := <-s.sigs:
			n++
			ss, _ := sig.(syscall.Signal)
			if s.onSignal(ctx, p, ss, n) {
				return 128 + int(ss), nil
			}
		}
	}
}

func (s *session) pumpStdin(ctx context.Context, p *client.Process) {
	buf := make([]byte, 32<<10)
	for {
		n, err := s.in.Read(buf)
		if n > 0 {
			if serr := p.SendStdin(ctx, buf[:n]); serr != nil {
				return
			}
		}
		if errors.Is(err, io.EOF) {
			if !s.tty {
				p.CloseStdin(ctx)
			}
			return
		}
		if err != nil {
			return
		}
	}
}

// notifySignals relays SIGINT and SIGTERM to the returned channel until
// stop is called.
func notifySignals() (<-chan os.Signal, func()) {
	c := make(chan os.Signal, 2)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	return c, func() { signal.Stop(c) }
}
