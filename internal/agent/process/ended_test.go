package process

import (
	"runtime/metrics"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/internal/agent/users"
)

// goroutinesCreated is how many goroutines the process has created.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// runTrue starts /bin/true on s and waits for its end.
func runTrue(t *testing.T, s *Service, u *users.User) *proc {
	t.Helper()
	f := false
	p, sub, err := s.start(u, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true"}, Stdin: &f})
	if err != nil {
		t.Fatal(err)
	}
	<-p.done
	p.unsubscribe(sub)
	return p
}

// A process's end and retention make no goroutine of their own: an exec
// makes three (its two output readers and the one that publishes its
// end), none to bound the drain of pipes already read to the end, and
// the threads' trim after a run of execs is one timer.
func TestExecGoroutines(t *testing.T) {
	s := NewService(Options{Users: &users.Resolver{DefaultUser: "root", DefaultWorkdir: "/"},
		Retention: time.Millisecond, IdleThreads: 1 << 20})
	defer s.Close()
	u, err := users.Lookup("root")
	if err != nil {
		t.Fatal(err)
	}
	runTrue(t, s, u) // the reaper's and the poller's start
	const n = 50
	before := goroutinesCreated()
	for range n {
		runTrue(t, s, u)
	}
	// Every timer the execs set (their retention, the retrim) has fired.
	time.Sleep(trimAfter + 200*time.Millisecond)
	made := goroutinesCreated() - before
	t.Logf("%d execs made %d goroutines", n, made)
	if made > 3*n+2 {
		t.Errorf("%d execs made %d goroutines, want at most %d (3 each, and the trim)", n, made, 3*n+2)
	}
}

// A finished process stays connectable for the retention time and is
// forgotten after it, by the first lookup or start past it.
func TestRetention(t *testing.T) {
	u, err := users.Lookup("root")
	if err != nil {
		t.Fatal(err)
	}
	for _, retention := range []time.Duration{time.Hour, time.Nanosecond} {
		s := NewService(Options{Users: &users.Resolver{DefaultUser: "root", DefaultWorkdir: "/"}, Retention: retention})
		defer s.Close()
		p := runTrue(t, s, u)
		sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: uint32(p.pid)}}
		// p.done is closed before the end is counted: wait for the count.
		for {
			s.mu.Lock()
			n := len(s.finished)
			s.mu.Unlock()
			if n > 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		got, err := s.lookup(sel)
		if retention == time.Hour {
			if err != nil || got != p {
				t.Fatalf("lookup of a process finished within its retention = %v, %v; want it", got, err)
			}
			s.mu.Lock()
			s.pruneLocked(time.Now().Add(2 * retention))
			s.mu.Unlock()
			_, err = s.lookup(sel)
		}
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("lookup past the retention (%v): %v, want not_found", retention, err)
		}
		s.mu.Lock()
		if len(s.procs) != 0 || len(s.finished) != 0 {
			t.Errorf("past the retention the service holds %d processes, %d finished; want none", len(s.procs), len(s.finished))
		}
		s.mu.Unlock()
	}
}

// While commands follow one another, the agent's threads are not trimmed
// at each one's end, only once the agent has been idle for trimAfter.
func TestThreadsTrimmedOnceIdle(t *testing.T) {
	s := NewService(Options{Users: &users.Resolver{DefaultUser: "root", DefaultWorkdir: "/"}, IdleThreads: 1 << 20})
	defer s.Close()
	u, err := users.Lookup("root")
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		runTrue(t, s, u)
	}
	if n := s.trims.Load(); n != 0 {
		t.Errorf("20 execs in a row trimmed the threads %d times, want none before the agent is idle", n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.trims.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.trims.Load(); n != 1 {
		t.Errorf("once idle the threads were trimmed %d times, want 1", n)
	}
}
