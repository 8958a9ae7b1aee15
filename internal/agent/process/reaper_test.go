package process

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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

// A child's status is read from its pidfd after it has been reaped, as
// the kernel does when it reaps the agent's children itself; a live
// child's pidfd says it has not exited.
func TestExitStatusFromPidfd(t *testing.T) {
	if !exitInPidfd() {
		t.Skip("kernel before 6.15: pidfds do not keep the exit status")
	}
	for _, c := range []struct {
		script string
		check  func(unix.WaitStatus) bool
	}{
		{"exit 3", func(ws unix.WaitStatus) bool { return ws.Exited() && ws.ExitStatus() == 3 }},
		{"kill -KILL $$", func(ws unix.WaitStatus) bool { return ws.Signaled() && ws.Signal() == unix.SIGKILL }},
	} {
		pidfd := -1
		pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", c.script},
			&syscall.ProcAttr{Sys: &syscall.SysProcAttr{PidFD: &pidfd}})
		if err != nil {
			t.Fatal(err)
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
			t.Fatal(err)
		}
		got, exited := exitStatus(pidfd)
		unix.Close(pidfd)
		if !exited || got != ws || !c.check(got) {
			t.Errorf("%q: exitStatus = %#x, %v; wait4 said %#x", c.script, got, exited, ws)
		}
	}
	pidfd := -1
	pid, err := syscall.ForkExec("/bin/sleep", []string{"sleep", "60"}, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{PidFD: &pidfd}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, 0, nil)
		unix.Close(pidfd)
	}()
	if _, exited := exitStatus(pidfd); exited {
		t.Error("exitStatus of a live child: exited")
	}
}
