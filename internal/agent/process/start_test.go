package process

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	pb "github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/internal/agent/users"
)

// statCalls are the system calls with which Go stats a path.
var statCalls = []string{"newfstatat", "statx", "newstat", "newlstat"}

// A start of an absolute program in an explicit working directory stats
// neither: the child's chdir and execve check them.
func TestStartStatsNothing(t *testing.T) {
	s := NewService(Options{Users: &users.Resolver{DefaultUser: "root", DefaultWorkdir: "/"}})
	defer s.Close()
	u, err := users.Lookup("root")
	if err != nil {
		t.Fatal(err)
	}
	cwd := t.TempDir()
	f := false
	var (
		p   *proc
		sub *subscriber
	)
	n := countSyscalls(t, statCalls, func() {
		p, sub, err = s.start(u, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true", Cwd: &cwd}, Stdin: &f})
	})
	if err != nil {
		t.Fatal(err)
	}
	p.unsubscribe(sub)
	<-p.done
	var stats uint64
	for _, c := range n {
		stats += c
	}
	if stats != 0 {
		t.Errorf("a start of /bin/true made %d stat calls (%v), want 0", stats, n)
	}
}

// A start that fails gives the error the checks of its working directory
// and program give, whichever the start found first.
func TestStartErrorsNameWhatIsMissing(t *testing.T) {
	s := NewService(Options{Users: &users.Resolver{DefaultUser: "root", DefaultWorkdir: "/"}})
	defer s.Close()
	u, err := users.Lookup("root")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		cmd, cwd, want string
	}{
		{"/bin/true", missing, `cwd "` + missing + `": stat ` + missing + `: no such file or directory`},
		{"/no/such/binary", missing, `cwd "` + missing + `": stat ` + missing + `: no such file or directory`},
		{"true", missing, `cwd "` + missing + `": stat ` + missing + `: no such file or directory`},
		{"/bin/true", file, `cwd "` + file + `" is not a directory`},
		{"/no/such/binary", dir, `command "/no/such/binary": stat /no/such/binary: no such file or directory`},
		{dir, dir, `command "` + dir + `": ` + dir + ` is a directory`},
		{file, dir, `command "` + file + `": ` + file + `: permission denied`},
		{"no-such-binary-xyz", dir, `command "no-such-binary-xyz": executable file not found in $PATH`},
	}
	for _, tt := range tests {
		f := false
		p, sub, err := s.start(u, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: tt.cmd, Cwd: &tt.cwd}, Stdin: &f})
		if err == nil {
			p.unsubscribe(sub)
			t.Errorf("%s in %s started", tt.cmd, tt.cwd)
			continue
		}
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s in %s: code %v, want invalid_argument", tt.cmd, tt.cwd, connect.CodeOf(err))
		}
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Message() != tt.want {
			t.Errorf("%s in %s: error %v, want %q", tt.cmd, tt.cwd, err, tt.want)
		}
	}
}
