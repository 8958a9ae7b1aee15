package process

import (
	"os/exec"
	"testing"
	"time"

	pb "github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/internal/agent/users"
)

// This test binary is neither PID 1 nor a subreaper: the reaper must wait
// only for its own children and leave exec.Cmd's alone.
func TestReaperInProcess(t *testing.T) {
	s := NewService(Options{Users: &users.Resolver{DefaultUser: "root", DefaultWorkdir: "/"}})
	defer s.Close()
	u, err := users.Lookup("root")
	if err != nil {
		t.Fatal(err)
	}
	f := false
	p, sub, err := s.start(u, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "exit 4"}}, Stdin: &f})
	if err != nil {
		t.Fatal(err)
	}
	defer p.unsubscribe(sub)
	if err := exec.Command("/bin/true").Run(); err != nil {
		t.Errorf("exec.Command(true).Run() = %v alongside the reaper", err)
	}
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatal("process end never seen")
	}
	if end := p.end.GetEnd(); end.GetExitCode() != 4 {
		t.Errorf("end = %v, want exit 4", end)
	}
}
