package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/api/envd/filesystem/filesystemconnect"
	pb "github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/api/envd/process/processconnect"
	"github.com/fencesandbox/fence/internal/agent/boot"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(warmChildEnv); mode != "" {
		warmChild(mode)
		os.Exit(0)
	}
	// The agent is PID 1 in a sandbox; here, become a subreaper so orphans
	// of the processes we start are reparented to this test process.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "PR_SET_CHILD_SUBREAPER:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

type env struct {
	url  string
	proc processconnect.ProcessClient
	fs   filesystemconnect.FilesystemClient
	dir  string
}

func newEnv(t *testing.T, cfg boot.Config) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("agent tests must run as root")
	}
	dir := t.TempDir()
	// File operations run as the request's user: nobody, too, may work
	// in the test's directory.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.DefaultUser == "" {
		cfg.DefaultUser = "root"
	}
	if cfg.DefaultWorkdir == "" {
		cfg.DefaultWorkdir = dir
	}
	h, closeFn := NewHandler(Options{Config: cfg})
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		closeFn()
		srv.Close()
	})
	return &env{
		url:  srv.URL,
		proc: processconnect.NewProcessClient(srv.Client(), srv.URL, connect.WithProtoJSON()),
		fs:   filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL, connect.WithProtoJSON()),
		dir:  dir,
	}
}

func basic(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

type result struct {
	pid    uint32
	stdout bytes.Buffer
	stderr bytes.Buffer
	pty    bytes.Buffer
	end    *pb.ProcessEvent_EndEvent
	events []string
}

// collect reads a process stream to its end.
func collect(t *testing.T, started bool, recv func() bool, msg func() *pb.ProcessEvent, errf func() error) *result {
	t.Helper()
	r := &result{}
	first := true
	for recv() {
		ev := msg()
		switch e := ev.GetEvent().(type) {
		case *pb.ProcessEvent_Start:
			r.pid = e.Start.GetPid()
			r.events = append(r.events, "start")
		case *pb.ProcessEvent_Data:
			r.stdout.Write(e.Data.GetStdout())
			r.stderr.Write(e.Data.GetStderr())
			r.pty.Write(e.Data.GetPty())
		case *pb.ProcessEvent_End:
			r.end = e.End
			r.events = append(r.events, "end")
		case *pb.ProcessEvent_Keepalive:
			r.events = append(r.events, "keepalive")
		}
		if first && r.pid == 0 && !started {
			t.Fatalf("first event = %v, want start", ev)
		}
		first = false
	}
	if err := errf(); err != nil {
		t.Fatalf("stream error: %v", err)
	}
	return r
}

func (e *env) start(ctx context.Context, t *testing.T, user string, req *pb.StartRequest, hdr map[string]string) (*connect.ServerStreamForClient[pb.StartResponse], error) {
	t.Helper()
	r := connect.NewRequest(req)
	if user != "" {
		r.Header().Set("Authorization", basic(user))
	}
	for k, v := range hdr {
		r.Header().Set(k, v)
	}
	return e.proc.Start(ctx, r)
}

// run bounds a command generously: 20 MB of output under -race on a busy
// 2-core machine takes tens of seconds; the bound only catches a hang.
func (e *env) run(t *testing.T, user string, req *pb.StartRequest) *result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := e.start(ctx, t, user, req, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer st.Close()
	return collect(t, false, st.Receive, func() *pb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
}

func bash(cmd string) *pb.StartRequest {
	f := false
	return &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", cmd}}, Stdin: &f}
}

func TestExitCodesAndOutput(t *testing.T) {
	e := newEnv(t, boot.Config{})
	tests := []struct {
		cmd            string
		code           int32
		status         string
		stdout, stderr string
	}{
		{"echo hi; echo err >&2", 0, "exit status 0", "hi\n", "err\n"},
		{"exit 3", 3, "exit status 3", "", ""},
		{"no-such-command-xyz", 127, "exit status 127", "", ""},
		{"kill -9 $$", -1, "signal: killed", "", ""},
	}
	for _, tt := range tests {
		r := e.run(t, "", bash(tt.cmd))
		if r.end == nil {
			t.Fatalf("run(%q): no end event", tt.cmd)
		}
		if r.end.GetExitCode() != tt.code || r.end.GetStatus() != tt.status {
			t.Errorf("run(%q) end = %d %q, want %d %q", tt.cmd, r.end.GetExitCode(), r.end.GetStatus(), tt.code, tt.status)
		}
		if got := r.stdout.String(); got != tt.stdout {
			t.Errorf("run(%q) stdout = %q, want %q", tt.cmd, got, tt.stdout)
		}
		if tt.stderr != "" && r.stderr.String() != tt.stderr {
			t.Errorf("run(%q) stderr = %q, want %q", tt.cmd, r.stderr.String(), tt.stderr)
		}
		if got := r.events[len(r.events)-1]; got != "end" {
			t.Errorf("run(%q) last event = %s, want end", tt.cmd, got)
		}
	}
}

// TestChildDescriptors: a child gets exactly its three descriptors, all
// blocking (the agent's ends of the pipes are non-blocking, the child's
// must not be), /dev/null read-only as stdin when it has none, pipes
// otherwise.
func TestChildDescriptors(t *testing.T) {
	e := newEnv(t, boot.Config{})
	// Flags are octal in fdinfo; O_NONBLOCK is 04000, the access mode the
	// low two bits.
	script := `for fd in 0 1 2; do echo "$fd $(readlink /proc/$$/fd/$fd | cut -c1-5) $(awk '/^flags/ {print $2}' /proc/$$/fdinfo/$fd)"; done`
	for _, stdin := range []bool{false, true} {
		// ls, started by the agent itself, lists its own directory
		// descriptor (3) too.
		ls := &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/ls", Args: []string{"/proc/self/fd"}}, Stdin: &stdin}
		r := e.run(t, "", ls)
		if got, want := strings.Join(strings.Fields(r.stdout.String()), " "), childFDs(t); got != want || r.end.GetExitCode() != 0 {
			t.Errorf("stdin %v: the child has descriptors %q (exit %d), want %q", stdin, got, r.end.GetExitCode(), want)
		}
		req := bash(script)
		req.Stdin = &stdin
		r = e.run(t, "", req)
		if r.end.GetExitCode() != 0 {
			t.Fatalf("stdin %v: exit %d: %s", stdin, r.end.GetExitCode(), r.stderr.String())
		}
		lines := strings.Split(strings.TrimSpace(r.stdout.String()), "\n")
		if len(lines) != 3 {
			t.Fatalf("stdin %v: output %q", stdin, r.stdout.String())
		}
		for i, line := range lines {
			f := strings.Fields(line)
			if len(f) != 3 {
				t.Fatalf("stdin %v: line %q", stdin, line)
			}
			flags, err := strconv.ParseUint(f[2], 8, 32)
			if err != nil {
				t.Fatalf("stdin %v: flags %q: %v", stdin, f[2], err)
			}
			if flags&unix.O_NONBLOCK != 0 {
				t.Errorf("stdin %v: fd %d is non-blocking (flags %o)", stdin, i, flags)
			}
			wantKind, wantMode := "pipe:", uint64(unix.O_WRONLY)
			if i == 0 {
				wantMode = unix.O_RDONLY
				if !stdin {
					wantKind = "/dev/"
				}
			}
			if f[1] != wantKind || flags&unix.O_ACCMODE != wantMode {
				t.Errorf("stdin %v: fd %d is %s with flags %o, want %s with access mode %o", stdin, i, f[1], flags, wantKind, wantMode)
			}
		}
	}
}

// TestChildSignalDispositions: a child starts with no signal handler (the
// agent's Go runtime handles every signal; the child must get the defaults
// back before it can receive one), nothing blocked, and only what this
// process was started with ignored.
func TestChildSignalDispositions(t *testing.T) {
	e := newEnv(t, boot.Config{})
	for _, stdin := range []bool{false, true} {
		// cat reads the file, not its stdin.
		req := &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/cat", Args: []string{"/proc/self/status"}}, Stdin: &stdin}
		r := e.run(t, "", req)
		if r.end.GetExitCode() != 0 {
			t.Fatalf("exit %d: %s", r.end.GetExitCode(), r.stderr.String())
		}
		got := sigFields(r.stdout.String())
		own, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		want := sigFields(string(own))
		if got["SigCgt"] != "0000000000000000" || got["SigBlk"] != "0000000000000000" || got["SigIgn"] != want["SigIgn"] {
			t.Errorf("stdin %v: the child has SigCgt %s, SigBlk %s, SigIgn %s; want no handler, nothing blocked, SigIgn %s",
				stdin, got["SigCgt"], got["SigBlk"], got["SigIgn"], want["SigIgn"])
		}
	}
}

// sigFields returns the Sig* lines of a /proc/PID/status.
func sigFields(status string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.HasPrefix(k, "Sig") {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// childFDs lists, as ls sorts them, the descriptors a child of this test
// may hold: 0, 1, 2, ls's own 3, and whatever this test process inherited
// without close-on-exec (a test harness's).
func childFDs(t *testing.T) string {
	t.Helper()
	names := []string{"0", "1", "2", "3"}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 3 {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

// TestManyConcurrentExits: exits reach their own streams, whichever of
// the pidfd and the SIGCHLD loop reaps them.
func TestManyConcurrentExits(t *testing.T) {
	e := newEnv(t, boot.Config{})
	const n = 40
	errs := make(chan error, n)
	for i := range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			f := false
			st, err := e.start(ctx, t, "", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "exit " + strconv.Itoa(i)}}, Stdin: &f}, nil)
			if err != nil {
				errs <- err
				return
			}
			defer st.Close()
			for st.Receive() {
				if end := st.Msg().GetEvent().GetEnd(); end != nil {
					if end.GetExitCode() != int32(i) {
						errs <- fmt.Errorf("exit %d reported as %d (%s)", i, end.GetExitCode(), end.GetStatus())
					} else {
						errs <- nil
					}
					return
				}
			}
			errs <- fmt.Errorf("exit %d: stream ended without an end event: %v", i, st.Err())
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestStartErrors(t *testing.T) {
	e := newEnv(t, boot.Config{})
	missing := e.dir + "/missing"
	tests := []struct {
		name string
		user string
		req  *pb.StartRequest
		code connect.Code
	}{
		{"missing binary", "", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/no/such/binary"}}, connect.CodeInvalidArgument},
		{"missing in PATH", "", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "no-such-binary-xyz"}}, connect.CodeInvalidArgument},
		{"missing cwd", "", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true", Cwd: &missing}}, connect.CodeInvalidArgument},
		{"unknown user", "no-such-user-xyz", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true"}}, connect.CodeUnauthenticated},
		{"empty cmd", "", &pb.StartRequest{Process: &pb.ProcessConfig{}}, connect.CodeInvalidArgument},
	}
	for _, tt := range tests {
		st, err := e.start(context.Background(), t, tt.user, tt.req, nil)
		if err == nil {
			for st.Receive() {
			}
			err = st.Err()
			st.Close()
		}
		if connect.CodeOf(err) != tt.code {
			t.Errorf("%s: Start error = %v, want code %v", tt.name, err, tt.code)
		}
	}
}

func TestLargeBinaryOutput(t *testing.T) {
	e := newEnv(t, boot.Config{})
	data := make([]byte, 10<<20+12345)
	rand.Read(data)
	path := e.dir + "/big.bin"
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.run(t, "", bash("cat "+path+"; cat "+path+" >&2"))
	if r.end.GetExitCode() != 0 {
		t.Fatalf("end = %v", r.end)
	}
	want := sha256.Sum256(data)
	if got := sha256.Sum256(r.stdout.Bytes()); got != want || r.stdout.Len() != len(data) {
		t.Errorf("stdout: %d bytes, sha mismatch=%v; want %d bytes", r.stdout.Len(), got != want, len(data))
	}
	if got := sha256.Sum256(r.stderr.Bytes()); got != want {
		t.Errorf("stderr: %d bytes, want %d identical bytes", r.stderr.Len(), len(data))
	}
}

func TestStdinAndCloseStdin(t *testing.T) {
	e := newEnv(t, boot.Config{})
	tr := true
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := e.start(ctx, t, "", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/cat"}, Stdin: &tr}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() {
		t.Fatalf("no start event: %v", st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	for _, s := range []string{"hello ", "world"} {
		if _, err := e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte(s)}}})); err != nil {
			t.Fatalf("SendInput: %v", err)
		}
	}
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatalf("CloseStdin: %v", err)
	}
	r := collect(t, true, func() bool { return st.Receive() }, func() *pb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
	if got := r.stdout.String(); got != "hello world" || r.end.GetExitCode() != 0 {
		t.Errorf("cat output = %q, end %v; want %q, exit 0", got, r.end, "hello world")
	}

	// stdin:false gets /dev/null, so cat ends at once.
	r = e.run(t, "", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/cat"}, Stdin: new(bool)})
	if r.end.GetExitCode() != 0 || r.stdout.Len() != 0 {
		t.Errorf("cat with stdin:false = %q, %v; want empty, exit 0", r.stdout.String(), r.end)
	}

	_, err = e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 1 << 30}},
		Input:   &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}},
	}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("SendInput(unknown pid) = %v, want not_found", err)
	}
}

// startBackground starts cmd, reads the start event and returns the pid
// and the still-open stream.
func (e *env) startBackground(t *testing.T, req *pb.StartRequest, hdr map[string]string) (uint32, *connect.ServerStreamForClient[pb.StartResponse], context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := e.start(ctx, t, "", req, hdr)
	if err != nil {
		cancel()
		t.Fatalf("Start: %v", err)
	}
	if !st.Receive() {
		cancel()
		t.Fatalf("no start event: %v", st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	if pid == 0 {
		cancel()
		t.Fatalf("first event = %v, want start", st.Msg())
	}
	return pid, st, func() { st.Close(); cancel() }
}

func selector(pid uint32) *pb.ProcessSelector {
	return &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
}

func TestSignalsListAndReconnect(t *testing.T) {
	e := newEnv(t, boot.Config{})
	ctx := context.Background()
	pid1, _, stop1 := e.startBackground(t, bash("sleep 100"), nil)
	stop1() // the client leaves: the process keeps running
	pid2, st2, stop2 := e.startBackground(t, bash("trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.05; done"), nil)
	for st2.Receive() && !strings.Contains(string(st2.Msg().GetEvent().GetData().GetStdout()), "ready") {
	}
	stop2()

	list, err := e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]bool{}
	for _, p := range list.Msg.GetProcesses() {
		seen[p.GetPid()] = true
	}
	if !seen[pid1] || !seen[pid2] {
		t.Fatalf("List = %v, want pids %d and %d", list.Msg.GetProcesses(), pid1, pid2)
	}

	// Reconnect to pid2 and terminate it.
	cst, err := e.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: selector(pid2)}))
	if err != nil {
		t.Fatal(err)
	}
	defer cst.Close()
	if !cst.Receive() || cst.Msg().GetEvent().GetStart().GetPid() != pid2 {
		t.Fatalf("Connect first event = %v, %v; want start %d", cst.Msg(), cst.Err(), pid2)
	}
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: selector(pid2), Signal: pb.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatalf("SendSignal(TERM): %v", err)
	}
	r := collect(t, true, func() bool { return cst.Receive() }, func() *pb.ProcessEvent { return cst.Msg().GetEvent() }, cst.Err)
	if r.end.GetExitCode() != 7 {
		t.Errorf("after SIGTERM end = %v, want exit 7", r.end)
	}

	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: selector(pid1), Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatalf("SendSignal(KILL): %v", err)
	}
	// A late Connect to the finished process still gets start then end.
	var late *result
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		cst, err := e.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: selector(pid1)}))
		if err != nil {
			t.Fatal(err)
		}
		late = collect(t, false, func() bool { return cst.Receive() }, func() *pb.ProcessEvent { return cst.Msg().GetEvent() }, cst.Err)
		cst.Close()
		if late.end != nil {
			break
		}
	}
	if late.end.GetStatus() != "signal: killed" || late.end.GetExited() {
		t.Errorf("late Connect end = %v, want signal: killed", late.end)
	}

	_, err = e.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: selector(1 << 30)}))
	if err == nil {
		cst, _ := e.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: selector(1 << 30)}))
		cst.Receive()
		err = cst.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Connect(unknown) = %v, want not_found", err)
	}
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: selector(1 << 30), Signal: pb.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("SendSignal(unknown) = %v, want not_found", err)
	}
}

func TestFanOutToTwoStreams(t *testing.T) {
	e := newEnv(t, boot.Config{})
	tr := true
	pid, st, stop := e.startBackground(t, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/cat"}, Stdin: &tr}, nil)
	defer stop()
	ctx := context.Background()
	cst, err := e.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: selector(pid)}))
	if err != nil {
		t.Fatal(err)
	}
	defer cst.Close()
	if !cst.Receive() {
		t.Fatal(cst.Err())
	}
	// The Connect stream is subscribed once its start event is out.
	if _, err := e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: selector(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("both")}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: selector(pid)})); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	outs := make([]string, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		var b bytes.Buffer
		for st.Receive() {
			b.Write(st.Msg().GetEvent().GetData().GetStdout())
		}
		outs[0] = b.String()
	}()
	go func() {
		defer wg.Done()
		var b bytes.Buffer
		for cst.Receive() {
			b.Write(cst.Msg().GetEvent().GetData().GetStdout())
		}
		outs[1] = b.String()
	}()
	wg.Wait()
	if outs[0] != "both" || outs[1] != "both" {
		t.Errorf("outputs = %q, want both streams to get %q", outs, "both")
	}
}

func TestConnectTimeoutKillsProcess(t *testing.T) {
	e := newEnv(t, boot.Config{})
	pidFile := e.dir + "/pid"
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	st, err := e.start(ctx, t, "", bash("echo $$ > "+pidFile+"; exec sleep 100"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for st.Receive() {
	}
	if connect.CodeOf(st.Err()) != connect.CodeDeadlineExceeded {
		t.Errorf("stream error = %v, want deadline_exceeded", st.Err())
	}
	st.Close()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	waitGone(t, pid)
}

// waitGone polls until pid no longer exists (killed and reaped).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	t.Fatalf("process %d still exists: %s", pid, st)
}

func TestOrphansAreReaped(t *testing.T) {
	e := newEnv(t, boot.Config{})
	r := e.run(t, "", bash("sleep 0.2 >/dev/null 2>&1 & echo $!"))
	pid, err := strconv.Atoi(strings.TrimSpace(r.stdout.String()))
	if err != nil {
		t.Fatalf("orphan pid %q: %v", r.stdout.String(), err)
	}
	waitGone(t, pid) // a zombie would keep /proc/pid
}

func TestKeepalive(t *testing.T) {
	e := newEnv(t, boot.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := e.start(ctx, t, "", bash("sleep 100"), map[string]string{"Keepalive-Ping-Interval": "1"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.Receive() // start
	pid := st.Msg().GetEvent().GetStart().GetPid()
	if !st.Receive() || st.Msg().GetEvent().GetKeepalive() == nil {
		t.Fatalf("second event = %v (%v), want keepalive", st.Msg(), st.Err())
	}
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: selector(pid), Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
}

func TestPTYAndResize(t *testing.T) {
	e := newEnv(t, boot.Config{})
	req := &pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Envs: map[string]string{"TERM": "xterm-256color", "PS1": "$ "}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 91, Rows: 27}},
	}
	pid, st, stop := e.startBackground(t, req, nil)
	defer stop()
	ctx := context.Background()
	var out bytes.Buffer
	send := func(s string) {
		t.Helper()
		if _, err := e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: selector(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(s)}}})); err != nil {
			t.Fatalf("SendInput: %v", err)
		}
	}
	waitFor := func(want string) {
		t.Helper()
		for !strings.Contains(out.String(), want) {
			if !st.Receive() {
				t.Fatalf("stream ended before %q; output %q (%v)", want, out.String(), st.Err())
			}
			out.Write(st.Msg().GetEvent().GetData().GetPty())
		}
	}
	send("stty size; tty; echo T=$TERM\n")
	waitFor("27 91")
	waitFor("T=xterm-256color")
	if strings.Contains(out.String(), "not a tty") {
		t.Errorf("tty output %q: no controlling tty", out.String())
	}
	if _, err := e.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: selector(pid), Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 120, Rows: 40}}})); err != nil {
		t.Fatalf("Update: %v", err)
	}
	send("stty size\n")
	waitFor("40 120")
	send("exit 5\n")
	for st.Receive() {
		if end := st.Msg().GetEvent().GetEnd(); end != nil {
			if end.GetExitCode() != 5 {
				t.Errorf("pty end = %v, want exit 5", end)
			}
			return
		}
	}
	t.Fatalf("no end event: %v", st.Err())
}

func TestEnvPrecedenceCwdAndUsers(t *testing.T) {
	cfg := boot.Config{EnvVars: map[string]string{"G": "global", "BOTH": "global"}}
	e := newEnv(t, cfg)
	req := bash(`echo "$G $BOTH $R $HOME $USER $LOGNAME $PATH"; pwd`)
	req.Process.Envs = map[string]string{"BOTH": "request", "R": "r"}
	r := e.run(t, "", req)
	want := "global request r /root root root /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n" + e.dir + "\n"
	if got := r.stdout.String(); got != want {
		t.Errorf("env/cwd output = %q, want %q", got, want)
	}
	// Request envs are not visible to later commands.
	if got := e.run(t, "", bash(`echo "[$R]"`)).stdout.String(); got != "[]\n" {
		t.Errorf("later command sees R: %q", got)
	}

	cwd := "/"
	req = bash("id -u; id -g; pwd; echo $HOME $USER")
	req.Process.Cwd = &cwd
	r = e.run(t, "nobody", req)
	if got := r.stdout.String(); !strings.HasPrefix(got, "65534\n") || !strings.Contains(got, "\n/\n") || !strings.Contains(got, " nobody\n") {
		t.Errorf("as nobody output = %q, want uid 65534, cwd /, USER nobody", got)
	}

	tilde := "~"
	req = bash("pwd")
	req.Process.Cwd = &tilde
	if got := e.run(t, "root", req).stdout.String(); got != "/root\n" {
		t.Errorf("cwd ~ = %q, want /root", got)
	}
}

func TestEnvsRouteAndHealth(t *testing.T) {
	e := newEnv(t, boot.Config{EnvVars: map[string]string{"A": "b"}})
	resp, err := http.Get(e.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("GET /health = %d, want 204", resp.StatusCode)
	}
	resp, err = http.Get(e.url + "/envs")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	if got := strings.TrimSpace(buf.String()); got != `{"A":"b"}` {
		t.Errorf("GET /envs = %s, want {\"A\":\"b\"}", got)
	}
}

// TestInit checks that POST /init replaces the sandbox-wide environment
// and defaults for processes started afterwards (a warm pool's agent).
func TestInit(t *testing.T) {
	e := newEnv(t, boot.Config{EnvVars: map[string]string{"OLD": "1"}})
	wd, err := os.MkdirTemp("", "fence-init-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(wd)
	os.Chmod(wd, 0o777)
	body := `{"envVars":{"FOO":"bar"},"defaultUser":"nobody","defaultWorkdir":"` + wd + `"}`
	resp, err := http.Post(e.url+"/init", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST /init = %d, want 204", resp.StatusCode)
	}
	r := e.run(t, "", bash(`echo "$FOO/${OLD:-unset}/$(id -u)/$PWD"`))
	if want := "bar/unset/65534/" + wd + "\n"; r.stdout.String() != want {
		t.Errorf("after /init: stdout %q, want %q", r.stdout.String(), want)
	}
	resp, err = http.Post(e.url+"/init", "application/json", strings.NewReader("{"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("POST /init with bad JSON = %d, want 400", resp.StatusCode)
	}
}
