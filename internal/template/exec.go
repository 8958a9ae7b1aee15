package template

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// waitDelay bounds how long a child may take to exit after SIGTERM before
// it is killed and its pipes are closed.
const waitDelay = 10 * time.Second

// command returns a child process bound to ctx: it runs in its own process
// group, which gets SIGTERM when ctx ends and SIGKILL waitDelay later.
func command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	}
	cmd.WaitDelay = waitDelay
	return cmd
}

// lineWriter writes every complete line it receives to w with a prefix and
// keeps the last few lines for error messages. It is safe for concurrent use
// (a child's stdout and stderr may share it).
type lineWriter struct {
	prefix string
	w      io.Writer

	mu   sync.Mutex
	buf  []byte   // +checklocks:mu
	tail []string // +checklocks:mu
}

const tailLines = 15

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.emitLocked(string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

// Flush writes a final unterminated line, if any.
func (l *lineWriter) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.emitLocked(string(l.buf))
		l.buf = nil
	}
}

// Tail returns the last lines written, joined by newlines.
func (l *lineWriter) Tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.tail, "\n")
}

// +checklocks:l.mu
func (l *lineWriter) emitLocked(line string) {
	line = strings.TrimRight(line, "\r")
	// Progress bars redraw with \r; keep only the last state.
	if i := strings.LastIndexByte(line, '\r'); i >= 0 {
		line = line[i+1:]
	}
	if line == "" {
		return
	}
	io.WriteString(l.w, l.prefix+line+"\n")
	l.tail = append(l.tail, line)
	if len(l.tail) > tailLines {
		l.tail = l.tail[len(l.tail)-tailLines:]
	}
}
