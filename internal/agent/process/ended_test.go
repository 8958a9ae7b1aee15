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
// the threads' retrim after a run of execs is one timer.
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
	time.Sleep(retrimAfter + 200*time.Millisecond)
	made := goroutinesCreated() - before
	t.Logf("%d execs made %d goroutines", n, made)
	if made > 3*n+2 {
		t.Errorf("%d execs made %d goroutines, want at most %d (3 each, and the retrim)", n, made, 3*n+2)
	}
}

// A finished process stays connectable for the retention time and is
// forgotten after it.
func TestRetention(t *testing.T) {
	s := NewService(Options{Users: &users.Resolver{DefaultUser: "root", DefaultWorkdir: "/"},
		Retention: 300 * time.Millisecond})
	defer s.Close()
	u, err := users.Lookup("root")
	if err != nil {
		t.Fatal(err)
	}
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
	if got, err := s.lookup(sel); err != nil || got != p {
		t.Fatalf("lookup of the finished process = %v, %v; want it", got, err)
	}
	time.Sleep(400 * time.Millisecond)
	if _, err := s.lookup(sel); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("lookup past the retention: %v, want not_found", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.procs) != 0 || len(s.finished) != 0 {
		t.Errorf("past the retention the service holds %d processes, %d finished; want none", len(s.procs), len(s.finished))
	}
}
