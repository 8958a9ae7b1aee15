package native

import (
	"bytes"
	"io"
	"os"
	"sync"
)

// limitedLog forwards the first bytes a sandbox's init and agent write to
// stderr into the daemon's log and drops the rest: the sandbox must not be
// able to fill the host's log.
type limitedLog struct {
	s    *sandbox
	mu   sync.Mutex
	left int
}

func (l *limitedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.left > 0 {
		q := p[:min(len(p), l.left)]
		l.left -= len(q)
		l.s.b.log.Warn("sandbox stderr", "sandbox_id", l.s.id, "output", string(bytes.TrimSpace(q)))
	}
	return len(p), nil
}

var _ io.Writer = (*limitedLog)(nil)

// drain forwards r to the log until EOF (when the sandbox's last holder of
// its stderr is gone), reading on past the log's budget so that a chatty
// agent never blocks on a full pipe.
func (l *limitedLog) drain(r *os.File) {
	defer r.Close()
	buf := make([]byte, 512)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			l.Write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}
