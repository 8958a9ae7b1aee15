package process

import (
	"errors"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	pb "github.com/fencesandbox/fence/api/envd/process"
)

// proc is one process started by the agent.
type proc struct {
	pid     int
	info    *pb.ProcessInfo
	stall   time.Duration
	budget  *budget
	onStall func() // drops the agent's stalled streams
	reaper  *reaper
	pidfd   *os.File      // nil if the kernel gave none
	stop    chan struct{} // closed when output readers must give up
	// readDone[i] is set once the reader of output i has read it to the
	// end and closes it: finish then sets no deadline on it.
	readDone [2]atomic.Bool

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
	s := newSubscriber(p.budget)
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

// publish hands ev to every stream. Its n payload bytes were taken from the
// budget once; every further stream takes its own n (each may hold the
// event until it has sent it); with no stream they go back at once.
func (p *proc) publish(ev *pb.ProcessEvent, n int) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	if len(subs) == 0 {
		p.budget.release(int64(n))
		return
	}
	for i, s := range subs {
		if i > 0 && n > 0 && !p.budget.acquire(int64(n), p.stop, p.stall, p.onStall) {
			continue
		}
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
	if !p.running() {
		// The process has ended (and was reaped): what may be left is its
		// session's other processes, still running. Its group may still
		// hold children that exited and wait for the reaper, which a
		// signal to the group would count as found: only the session's
		// live members count.
		if signalSession(p.pid, sig) {
			return nil
		}
		return unix.ESRCH
	}
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

// readChunk is the most one read from a process's output takes.
const readChunk = 32 << 10

// readBufs are the buffers of reads in progress; a reader waiting for
// output holds none.
var readBufs = sync.Pool{New: func() any { b := make([]byte, readChunk); return &b }}

// readOutput copies f into data events of the given kind until EOF. Before
// each read it takes readChunk bytes of the budget (giving back what the
// read did not use), so the agent reads no more output than it may hold.
func (p *proc) readOutput(f *os.File, i, kind int, closeFile bool, wg *sync.WaitGroup) {
	defer wg.Done()
	if closeFile {
		defer func() {
			p.readDone[i].Store(true)
			f.Close()
		}()
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	draining := false // past the read deadline: read what is left, never wait
	for {
		if !p.budget.acquire(readChunk, p.stop, p.stall, p.onStall) {
			return
		}
		var data []byte
		var rerr error
		read := func(fd uintptr) bool {
			buf := readBufs.Get().(*[]byte)
			defer readBufs.Put(buf)
			n, e := unix.Read(int(fd), *buf)
			for e == unix.EINTR {
				n, e = unix.Read(int(fd), *buf)
			}
			if e == unix.EAGAIN && !draining {
				return false
			}
			if n > 0 {
				data = append([]byte(nil), (*buf)[:n]...)
			}
			switch {
			case e != nil:
				rerr = e
			case n == 0:
				rerr = io.EOF
			}
			return true
		}
		if draining {
			err = rc.Control(func(fd uintptr) { read(fd) })
		} else {
			err = rc.Read(read)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// The process has exited and the grace has passed: take
				// what is still buffered, then stop.
				draining = true
				p.budget.release(readChunk)
				continue
			}
		}
		p.budget.release(int64(readChunk - len(data)))
		if len(data) > 0 {
			p.publish(dataEvent(kind, data), len(data))
		}
		if err != nil || rerr != nil || (draining && len(data) == 0) {
			return
		}
	}
}

// finish waits for the exit, lets the output drain (for at most grace once
// the process has exited: a background grandchild may hold the pipes
// open), then publishes the end event.
func (p *proc) finish(outputs []*os.File, wg *sync.WaitGroup, grace time.Duration, onDone func()) {
	if p.pidfd != nil {
		p.reaper.awaitExit(p.pid, p.pidfd)
		p.pidfd.Close()
	}
	<-p.exited
	// What the process wrote is read to the end, however long the
	// streams take to send it (they are bounded by the stall timeout);
	// the grace only bounds the wait for more output once the pipes are
	// empty. A descriptor the poller cannot time out is closed after the
	// grace instead.
	var unpollable []*os.File
	for i, f := range outputs {
		if p.readDone[i].Load() {
			continue // read to the end: nothing left to bound
		}
		if err := f.SetReadDeadline(time.Now().Add(grace)); err != nil {
			unpollable = append(unpollable, f)
		}
	}
	if len(unpollable) > 0 {
		drained := make(chan struct{})
		go func() { wg.Wait(); close(drained) }()
		t := time.NewTimer(grace)
		select {
		case <-drained:
		case <-t.C:
			close(p.stop)
			for _, f := range unpollable {
				f.Close()
			}
		}
		t.Stop()
	}
	wg.Wait()
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
