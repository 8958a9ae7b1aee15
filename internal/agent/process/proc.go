package process

import (
	"errors"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	pb "github.com/fencesandbox/fence/api/envd/process"
)

// proc is one process started by the agent.
type proc struct {
	pid   int
	info  *pb.ProcessInfo
	stall time.Duration

	master  *os.File // PTY master, nil without a PTY
	stdinMu sync.Mutex
	stdin   *os.File // write end of the stdin pipe, nil if none or closed

	exited chan struct{} // closed by the reaper
	status unix.WaitStatus
	done   chan struct{} // closed once the end event is published

	mu        sync.Mutex
	subs      map[*subscriber]struct{}
	end       *pb.ProcessEvent
	killTimer *time.Timer
}

// subscribe returns a new stream queue; for a finished process it holds
// just the end event.
func (p *proc) subscribe() *subscriber {
	s := newSubscriber()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		s.push(p.end, 0, p.stall)
		return s
	}
	p.subs[s] = struct{}{}
	return s
}

func (p *proc) unsubscribe(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	s.close()
}

func (p *proc) publish(ev *pb.ProcessEvent, n int) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		s.push(ev, n, p.stall)
	}
}

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signal sends sig to the session p leads: its process group, then every
// other process of the session (job control moves background jobs to
// groups of their own). It fails with ESRCH only if nothing was left.
func (p *proc) signal(sig unix.Signal) error {
	err := unix.Kill(-p.pid, sig)
	if errors.Is(err, unix.ESRCH) && p.running() {
		err = unix.Kill(p.pid, sig)
	}
	if signalSession(p.pid, sig) && errors.Is(err, unix.ESRCH) {
		err = nil
	}
	return err
}

// killAt kills the process group when t passes, unless p has ended.
func (p *proc) killAt(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil || p.killTimer != nil {
		return
	}
	p.killTimer = time.AfterFunc(time.Until(t), func() {
		if p.running() {
			_ = p.signal(unix.SIGKILL)
		}
	})
}

// readOutput copies f into data events of the given kind until EOF.
func (p *proc) readOutput(f *os.File, kind int, closeFile bool, wg *sync.WaitGroup) {
	defer wg.Done()
	if closeFile {
		defer f.Close()
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			b := make([]byte, n)
			copy(b, buf[:n])
			p.publish(dataEvent(kind, b), n)
		}
		if err != nil {
			return
		}
	}
}

// finish waits for the exit, lets the output drain (for at most grace once
// the process has exited: a background grandchild may hold the pipes
// open), then publishes the end event.
func (p *proc) finish(outputs []*os.File, wg *sync.WaitGroup, grace time.Duration, onDone func()) {
	<-p.exited
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	t := time.NewTimer(grace)
	select {
	case <-drained:
	case <-t.C:
		for _, f := range outputs {
			f.Close()
		}
		<-drained
	}
	t.Stop()
	p.stdinMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.stdinMu.Unlock()

	end := &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: endEvent(p.status)}}
	p.mu.Lock()
	p.end = end
	if p.killTimer != nil {
		p.killTimer.Stop()
	}
	subs := p.subs
	p.subs = nil
	p.mu.Unlock()
	for s := range subs {
		s.push(end, 0, p.stall)
	}
	if p.master != nil {
		p.master.Close()
	}
	close(p.done)
	onDone()
}

// endEvent describes ws the way Go's os.ProcessState does, as envd does.
func endEvent(ws unix.WaitStatus) *pb.ProcessEvent_EndEvent {
	e := &pb.ProcessEvent_EndEvent{ExitCode: -1}
	switch {
	case ws.Exited():
		e.Exited = true
		e.ExitCode = int32(ws.ExitStatus())
		e.Status = "exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		e.Status = "signal: " + ws.Signal().String()
	default:
		e.Status = "unknown status"
	}
	if ws.CoreDump() {
		e.Status += " (core dumped)"
	}
	if e.ExitCode != 0 {
		msg := e.Status
		e.Error = &msg
	}
	return e
}
