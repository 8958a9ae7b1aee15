package process

import (
	"os"
	"testing"
	"time"

	pb "github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/internal/agent/users"
)

// While forks are held (the agent's start is not complete), a Start or a
// Spawn waits; both go on once the hold is released.
func TestHoldForksHoldsEveryStart(t *testing.T) {
	s := NewService(Options{Users: &users.Resolver{DefaultUser: "root", DefaultWorkdir: "/"}})
	defer s.Close()
	ready := make(chan struct{})
	s.HoldForks(ready)
	u, err := users.Lookup("root")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 2)
	go func() {
		f := false
		p, sub, err := s.start(u, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true"}, Stdin: &f})
		if err == nil {
			p.unsubscribe(sub)
		}
		started <- err
	}()
	go func() {
		null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
		if err != nil {
			started <- err
			return
		}
		defer null.Close()
		_, exited, err := s.Spawn(SpawnSpec{User: u, Argv: []string{"/bin/true"}, Stdio: [3]*os.File{null, null, null}})
		if err == nil {
			<-exited
		}
		started <- err
	}()
	select {
	case err := <-started:
		t.Fatalf("a process started while forks were held (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(ready)
	for range 2 {
		select {
		case err := <-started:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a start did not go on once forks were released")
		}
	}
}
